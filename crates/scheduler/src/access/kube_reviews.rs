//! TokenReview (authentication.k8s.io/v1) and SubjectAccessReview (authorization.k8s.io/v1)
//! through kube-rs. The binary's ServiceAccount needs `create` on both (the built-in
//! ClusterRole `system:auth-delegator`, which the deploy binds).

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::review::{Access, Decision, ReviewError, Reviews, User};

/// The API server's reviews.
#[derive(Clone)]
pub struct KubeReviews {
    client: kube::Client,
}

impl KubeReviews {
    pub fn new(client: kube::Client) -> Self {
        KubeReviews { client }
    }
}

fn review_error(e: kube::Error) -> ReviewError {
    match e {
        kube::Error::Api(status) => {
            ReviewError::Refused(format!("{} ({})", status.message, status.code))
        }
        other => ReviewError::Unreachable(other.to_string()),
    }
}

/// The SubjectAccessReview asking whether `user` may do `access`.
pub fn access_review(user: &User, access: &Access) -> SubjectAccessReview {
    let (resource_attributes, non_resource_attributes) = match access {
        Access::Path { path, verb } => (
            None,
            Some(NonResourceAttributes {
                path: Some(path.clone()),
                verb: Some(verb.clone()),
            }),
        ),
        Access::Resource {
            namespace,
            verb,
            group,
            resource,
        } => (
            Some(ResourceAttributes {
                namespace: Some(namespace.clone()),
                verb: Some(verb.clone()),
                group: Some(group.clone()),
                resource: Some(resource.clone()),
                ..ResourceAttributes::default()
            }),
            None,
        ),
    };
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            resource_attributes,
            non_resource_attributes,
        },
        ..SubjectAccessReview::default()
    }
}

/// The user a TokenReview's status names, when it authenticated the token.
pub fn reviewed_user(review: &TokenReview) -> Option<User> {
    let status = review.status.as_ref()?;
    if status.authenticated != Some(true) {
        return None;
    }
    let info = status.user.as_ref()?;
    Some(User {
        name: info.username.clone().unwrap_or_default(),
        uid: info.uid.clone().unwrap_or_default(),
        groups: info.groups.clone().unwrap_or_default(),
        extra: info.extra.clone().unwrap_or_default(),
    })
}

impl Reviews for KubeReviews {
    async fn authenticate(&self, token: &str) -> Result<Option<User>, ReviewError> {
        if token.is_empty() {
            // The server answers 400 "token is required"; no need to ask.
            return Ok(None);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answered = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(review_error)?;
        Ok(reviewed_user(&answered))
    }

    async fn authorize(&self, user: &User, access: &Access) -> Result<Decision, ReviewError> {
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answered = api
            .create(&PostParams::default(), &access_review(user, access))
            .await
            .map_err(review_error)?;
        let status = answered.status.unwrap_or_default();
        Ok(Decision {
            allowed: status.allowed && status.denied != Some(true),
            reason: status.reason.unwrap_or_default(),
        })
    }
}
