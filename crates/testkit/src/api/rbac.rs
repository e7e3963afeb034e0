//! TokenReview and SubjectAccessReview as kube-apiserver answers them: ServiceAccount
//! tokens (user `system:serviceaccount:NS:NAME` in groups `system:serviceaccounts`,
//! `system:serviceaccounts:NS` and `system:authenticated`), RBAC's rules (ClusterRoles
//! and ClusterRoleBindings; Roles and RoleBindings, namespaced; `system:masters` allowed
//! everything), and the server's validation of a review (400 for an empty token; a
//! SubjectAccessReview needs a user or a group and exactly one of resource and
//! non-resource attributes). Each review is a request, charged the server's costs.

use gpuplace_scheduler::access::kube_reviews::access_review;
use gpuplace_scheduler::access::{Access, Decision, ReviewError, Reviews, User};
use k8s_openapi::api::authorization::v1::SubjectAccessReviewSpec;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};

use super::{MemoryApi, Rbac};

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

fn namespace_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.namespace.as_deref().unwrap_or_default()
}

fn subject_matches(
    subject: &k8s_openapi::api::rbac::v1::Subject,
    user: &str,
    groups: &[String],
    binding_ns: &str,
) -> bool {
    match subject.kind.as_str() {
        "User" => subject.name == user,
        "Group" => groups.contains(&subject.name),
        "ServiceAccount" => {
            let ns = subject.namespace.as_deref().unwrap_or(binding_ns);
            user == format!("system:serviceaccount:{ns}:{}", subject.name)
        }
        _ => false,
    }
}

fn has(list: &[String], want: &str) -> bool {
    list.iter().any(|v| v == "*" || v == want)
}

/// A non-resource URL rule: exact, `*`, or a prefix ending in `*`.
fn url_matches(rule: &str, path: &str) -> bool {
    rule == "*"
        || rule == path
        || rule
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

fn rule_allows(rule: &PolicyRule, access: &Access) -> bool {
    match access {
        Access::Path { path, verb } => {
            has(&rule.verbs, verb)
                && rule
                    .non_resource_urls
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .any(|u| url_matches(u, path))
        }
        Access::Resource {
            verb,
            group,
            resource,
            ..
        } => {
            has(&rule.verbs, verb)
                && has(rule.api_groups.as_deref().unwrap_or_default(), group)
                && has(rule.resources.as_deref().unwrap_or_default(), resource)
                && rule
                    .resource_names
                    .as_deref()
                    .unwrap_or_default()
                    .is_empty()
        }
    }
}

/// The server's validation of a SubjectAccessReview's spec (messages as v1.26 words them).
fn validate(spec: &SubjectAccessReviewSpec) -> Result<(), ReviewError> {
    const INVALID: &str = ".authorization.k8s.io \"\" is invalid";
    let has_user = spec.user.as_deref().is_some_and(|u| !u.is_empty());
    let has_groups = spec.groups.as_deref().is_some_and(|g| !g.is_empty());
    if !has_user && !has_groups {
        return Err(ReviewError::Refused(format!(
            "{INVALID}: spec.user: Invalid value: \"\": at least one of user or group must be specified (422)"
        )));
    }
    match (&spec.resource_attributes, &spec.non_resource_attributes) {
        (None, None) => Err(ReviewError::Refused(format!(
            "{INVALID}: spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified (422)"
        ))),
        (Some(_), Some(_)) => Err(ReviewError::Refused(format!(
            "{INVALID}: spec.nonResourceAttributes: cannot be specified in combination with resourceAttributes (422)"
        ))),
        _ => Ok(()),
    }
}

impl Rbac {
    fn cluster_rules(&self, name: &str) -> Vec<&PolicyRule> {
        self.cluster_roles
            .iter()
            .filter(|r| name_of(&r.metadata) == name)
            .flat_map(|r| r.rules.as_deref().unwrap_or_default())
            .collect()
    }

    fn role_rules(&self, namespace: &str, name: &str) -> Vec<&PolicyRule> {
        self.roles
            .iter()
            .filter(|r| name_of(&r.metadata) == name && namespace_of(&r.metadata) == namespace)
            .flat_map(|r| r.rules.as_deref().unwrap_or_default())
            .collect()
    }

    fn decide(&self, user: &User, access: &Access) -> Decision {
        let (name, groups) = (user.name.as_str(), user.groups.as_slice());
        if groups.iter().any(|g| g == "system:masters") {
            return allowed("system:masters");
        }
        for b in &self.cluster_bindings {
            let subjects = b.subjects.as_deref().unwrap_or_default();
            if subjects
                .iter()
                .any(|s| subject_matches(s, name, groups, ""))
                && self
                    .cluster_rules(&b.role_ref.name)
                    .into_iter()
                    .any(|r| rule_allows(r, access))
            {
                return allowed(&format!(
                    "RBAC: allowed by ClusterRoleBinding {:?} of ClusterRole {:?} to {}",
                    name_of(&b.metadata),
                    b.role_ref.name,
                    subject_text(name)
                ));
            }
        }
        if let Access::Resource { namespace, .. } = access
            && !namespace.is_empty()
        {
            for b in self
                .bindings
                .iter()
                .filter(|b| namespace_of(&b.metadata) == namespace)
            {
                let subjects = b.subjects.as_deref().unwrap_or_default();
                if !subjects
                    .iter()
                    .any(|s| subject_matches(s, name, groups, namespace))
                {
                    continue;
                }
                let rules = if b.role_ref.kind == "ClusterRole" {
                    self.cluster_rules(&b.role_ref.name)
                } else {
                    self.role_rules(namespace, &b.role_ref.name)
                };
                if rules.into_iter().any(|r| rule_allows(r, access)) {
                    return allowed(&format!(
                        "RBAC: allowed by RoleBinding \"{}/{}\" of {} {:?} to {}",
                        name_of(&b.metadata),
                        namespace,
                        b.role_ref.kind,
                        b.role_ref.name,
                        subject_text(name)
                    ));
                }
            }
        }
        Decision {
            allowed: false,
            reason: String::new(),
        }
    }
}

/// How RBAC's reasons name the user: `ServiceAccount "name/namespace"` or `User "name"`.
fn subject_text(user: &str) -> String {
    match user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
    {
        Some((namespace, name)) => format!("ServiceAccount \"{name}/{namespace}\""),
        None => format!("User {user:?}"),
    }
}

fn allowed(reason: &str) -> Decision {
    Decision {
        allowed: true,
        reason: reason.to_string(),
    }
}

impl MemoryApi {
    fn rbac(&self) -> std::sync::MutexGuard<'_, Rbac> {
        self.rbac.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A token of ServiceAccount `namespace/name`, as `kubectl create token` makes one.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        let mut rbac = self.rbac();
        let token = format!("sa.{namespace}.{name}.{}", rbac.tokens.len() + 1);
        rbac.tokens.insert(
            token.clone(),
            User {
                name: format!("system:serviceaccount:{namespace}:{name}"),
                uid: format!("uid-{namespace}-{name}"),
                groups: vec![
                    "system:serviceaccounts".into(),
                    format!("system:serviceaccounts:{namespace}"),
                    "system:authenticated".into(),
                ],
                extra: Default::default(),
            },
        );
        token
    }

    /// Takes a token back (the ServiceAccount deleted): it no longer authenticates.
    pub fn revoke_token(&self, token: &str) {
        self.rbac().tokens.remove(token);
    }

    pub fn put_cluster_role(&self, role: ClusterRole) {
        self.rbac().cluster_roles.push(role);
    }

    pub fn put_cluster_role_binding(&self, binding: ClusterRoleBinding) {
        self.rbac().cluster_bindings.push(binding);
    }

    pub fn put_role(&self, role: Role) {
        self.rbac().roles.push(role);
    }

    pub fn put_role_binding(&self, binding: RoleBinding) {
        self.rbac().bindings.push(binding);
    }

    /// TokenReviews and SubjectAccessReviews answered so far.
    pub fn reviews(&self) -> usize {
        self.rbac().reviews
    }
}

impl Reviews for MemoryApi {
    async fn authenticate(&self, token: &str) -> Result<Option<User>, ReviewError> {
        let (_in_flight, _) = self.charge().await;
        let mut rbac = self.rbac();
        rbac.reviews += 1;
        if token.is_empty() {
            return Err(ReviewError::Refused(
                "token is required for TokenReview in authentication (400)".into(),
            ));
        }
        Ok(rbac.tokens.get(token).cloned())
    }

    async fn authorize(&self, user: &User, access: &Access) -> Result<Decision, ReviewError> {
        let (_in_flight, _) = self.charge().await;
        validate(&access_review(user, access).spec)?;
        let mut rbac = self.rbac();
        rbac.reviews += 1;
        Ok(rbac.decide(user, access))
    }
}
