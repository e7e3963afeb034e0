//! The boundary between the served surfaces and the API server's authentication and
//! authorization: a token in, a user out; a user and an access in, a decision out.

use std::collections::BTreeMap;
use std::future::Future;

/// A user as TokenReview returns it and SubjectAccessReview takes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What a request asks to do, in SubjectAccessReview's terms.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Access {
    /// A non-resource URL (`/metrics`, `/ui/api/fleet`) and a verb (`get`).
    Path { path: String, verb: String },
    /// A resource in a namespace ("" for every namespace): e.g. `list` `pods` in `ml`.
    Resource {
        namespace: String,
        verb: String,
        group: String,
        resource: String,
    },
}

impl Access {
    /// `verb` on the URL `path`.
    pub fn path(path: &str, verb: &str) -> Self {
        Access::Path {
            path: path.to_string(),
            verb: verb.to_string(),
        }
    }

    /// `list pods` in `namespace` ("" for all of them).
    pub fn list_pods(namespace: &str) -> Self {
        Access::Resource {
            namespace: namespace.to_string(),
            verb: "list".into(),
            group: String::new(),
            resource: "pods".into(),
        }
    }
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Access::Path { path, verb } => write!(f, "{verb} {path}"),
            Access::Resource {
                namespace,
                verb,
                group,
                resource,
            } => {
                let kind = if group.is_empty() {
                    resource.clone()
                } else {
                    format!("{resource}.{group}")
                };
                if namespace.is_empty() {
                    write!(f, "{verb} {kind} in every namespace")
                } else {
                    write!(f, "{verb} {kind} in namespace {namespace}")
                }
            }
        }
    }
}

/// The authorizer's answer: allowed or not, with its reason (empty when it gave none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

/// Why a review has no answer. Neither is cached: the next request asks again.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    /// The server answered with an error (e.g. 403: this binary may not create reviews,
    /// its ServiceAccount lacks `system:auth-delegator`).
    #[error("the API server refused the review: {0}")]
    Refused(String),
    /// No answer (connection refused, time-out).
    #[error("the API server did not answer the review: {0}")]
    Unreachable(String),
}

/// The API server's TokenReview and SubjectAccessReview.
pub trait Reviews: Clone + Send + Sync + 'static {
    /// The user a bearer token belongs to; `None` when the server does not accept it.
    fn authenticate(
        &self,
        token: &str,
    ) -> impl Future<Output = Result<Option<User>, ReviewError>> + Send;

    /// Whether `user` may do `access`.
    fn authorize(
        &self,
        user: &User,
        access: &Access,
    ) -> impl Future<Output = Result<Decision, ReviewError>> + Send;
}
