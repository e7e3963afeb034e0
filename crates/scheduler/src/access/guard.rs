//! The HTTP guard: every request but the probes needs a bearer token the API server
//! accepts and `get` (`create` for POST...) on its URL path, as a non-resource URL:
//! `/metrics` for the metrics, `/ui` and `/ui/*` for the map. Without a token: 401 (the
//! map's page answers with its sign-in form); with a token refused: 401; without the
//! right: 403 naming the user and the access. The map also takes the token from a cookie
//! set by its sign-in form (`POST /ui/login`; HttpOnly, Secure, SameSite=Strict, path
//! `/ui`), as the Kubernetes Dashboard signs users in.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use futures::future::BoxFuture;
use tracing::warn;

use super::cache::Cached;
use super::review::{Access, Reviews, User};

/// The cookie the map's sign-in form sets.
pub const TOKEN_COOKIE: &str = "gpuplace-token";
/// Where the sign-in form posts, and where signing out posts.
pub const LOGIN_PATH: &str = "/ui/login";
pub const LOGOUT_PATH: &str = "/ui/logout";
/// Served to anyone: the kubelet's probes carry no token.
const OPEN: &[&str] = &["/healthz", "/readyz", "/livez"];
/// How long the sign-in cookie lasts (the token's own expiry still applies).
const COOKIE_MAX_AGE_S: u64 = 8 * 3600;
/// Namespace reviews asked at once for one map request.
const NAMESPACE_REVIEWS_AT_ONCE: usize = 16;

/// The page a browser gets instead of a 401 or 403 (the map's sign-in form), given the
/// line to show on it.
pub type SignIn = Arc<dyn Fn(StatusCode, &str) -> Response + Send + Sync>;

/// The guard's state: the (cached) reviews and, when the map is served, its sign-in page.
#[derive(Clone)]
pub struct Guard<R> {
    reviews: Cached<R>,
    sign_in: Option<SignIn>,
}

impl<R: Reviews> Guard<R> {
    pub fn new(reviews: R) -> Self {
        Guard {
            reviews: Cached::new(reviews),
            sign_in: None,
        }
    }

    /// Browsers asking for the map's pages without a usable token get `page`.
    pub fn with_sign_in(mut self, page: SignIn) -> Self {
        self.sign_in = Some(page);
        self
    }
}

/// The verb a request asks for, as kube-rbac-proxy and the API server name it.
pub fn verb(method: &Method) -> &'static str {
    match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

/// The bearer token of `Authorization`, else (under `/ui`) the sign-in cookie's.
fn token(headers: &HeaderMap, path: &str) -> Option<String> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .filter(|t| !t.is_empty());
    if let Some(t) = bearer {
        return Some(t.to_string());
    }
    if !(path == "/ui" || path.starts_with("/ui/")) {
        return None;
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == TOKEN_COOKIE)
        .map(|(_, value)| value.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// Whether `path` is one of the map's pages (where a browser lands), not its API.
fn is_page(path: &str) -> bool {
    path == "/ui" || path == "/ui/"
}

/// `response` with the challenge a 401 carries.
fn challenged(mut response: Response) -> Response {
    if response.status() == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"gpuplace\""),
        );
    }
    response
}

fn plain(status: StatusCode, body: String) -> Response {
    challenged((status, body).into_response())
}

impl<R: Reviews> Guard<R> {
    fn refuse(&self, path: &str, status: StatusCode, line: String) -> Response {
        match &self.sign_in {
            Some(page) if is_page(path) => challenged(page(status, &line)),
            _ => plain(status, line),
        }
    }

    /// The user behind `token` allowed `access`, or the response refusing it.
    async fn admit(&self, token: &str, access: &Access, path: &str) -> Result<User, Response> {
        if token.len() > super::cache::MAX_TOKEN_BYTES {
            let line = format!(
                "Unauthorized: the token is longer than {} KiB, the most this server reviews",
                super::cache::MAX_TOKEN_BYTES / 1024
            );
            return Err(self.refuse(path, StatusCode::UNAUTHORIZED, line));
        }
        let user = match self.reviews.authenticate(token).await {
            Ok(Some(user)) => user,
            Ok(None) => {
                let line = "Unauthorized: the API server did not accept this token".to_string();
                return Err(self.refuse(path, StatusCode::UNAUTHORIZED, line));
            }
            Err(e) => {
                warn!(error = %e, "cannot authenticate a request");
                let line = format!("Unauthorized: the token could not be checked: {e}");
                return Err(self.refuse(path, StatusCode::UNAUTHORIZED, line));
            }
        };
        match self.reviews.authorize(&user, access).await {
            Ok(d) if d.allowed => Ok(user),
            Ok(d) => {
                let why = if d.reason.is_empty() {
                    String::new()
                } else {
                    format!(": {}", d.reason)
                };
                let line = format!("Forbidden: user {:?} may not {access}{why}", user.name);
                Err(self.refuse(path, StatusCode::FORBIDDEN, line))
            }
            Err(e) => {
                warn!(error = %e, user = %user.name, %access, "cannot authorize a request");
                let line = format!("the request could not be authorized: {e}");
                Err(plain(StatusCode::INTERNAL_SERVER_ERROR, line))
            }
        }
    }
}

/// The middleware: admits the request (and hands the handlers its [`Viewer`]) or refuses it.
pub async fn check<R: Reviews>(
    State(guard): State<Guard<R>>,
    mut request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path().to_string();
    if OPEN.contains(&path.as_str()) {
        return next.run(request).await;
    }
    if guard.sign_in.is_some() && request.method() == Method::POST {
        if (path == LOGIN_PATH || path == LOGOUT_PATH) && !same_origin(request.headers()) {
            let line = "Forbidden: the form was posted from another site".to_string();
            return plain(StatusCode::FORBIDDEN, line);
        }
        if path == LOGIN_PATH {
            return sign_in(&guard, request).await;
        }
        if path == LOGOUT_PATH {
            return signed_out();
        }
    }
    let Some(token) = token(request.headers(), &path) else {
        let line = "Unauthorized: send a bearer token (Authorization: Bearer ...)".to_string();
        return guard.refuse(&path, StatusCode::UNAUTHORIZED, line);
    };
    let access = Access::path(&path, verb(request.method()));
    let user = match guard.admit(&token, &access, &path).await {
        Ok(user) => user,
        Err(refused) => return refused,
    };
    let reviews = guard.reviews.clone();
    let check_user = user.clone();
    let check: Check = Arc::new(move |access: Access| {
        let (reviews, user) = (reviews.clone(), check_user.clone());
        Box::pin(async move {
            match reviews.authorize(&user, &access).await {
                Ok(d) => d.allowed,
                Err(e) => {
                    warn!(error = %e, user = %user.name, %access, "namespace check failed; hidden");
                    false
                }
            }
        })
    });
    request.extensions_mut().insert(Viewer { user, check });
    next.run(request).await
}

/// The sign-in form's token, checked as a request for `/ui` would be; a cookie on success.
async fn sign_in<R: Reviews>(guard: &Guard<R>, request: Request) -> Response {
    let body = match axum::body::to_bytes(request.into_body(), 64 * 1024).await {
        Ok(b) => b,
        Err(_) => return plain(StatusCode::PAYLOAD_TOO_LARGE, "form too large".into()),
    };
    let token = form_token(&body);
    let Some(token) = token.filter(|t| is_cookie_safe(t)) else {
        let line = "Unauthorized: paste a bearer token (e.g. kubectl create token NAME)";
        return guard.refuse("/ui", StatusCode::UNAUTHORIZED, line.to_string());
    };
    if let Err(refused) = guard
        .admit(&token, &Access::path("/ui", "get"), "/ui")
        .await
    {
        return refused;
    }
    let cookie = format!(
        "{TOKEN_COOKIE}={token}; Path=/ui; Max-Age={COOKIE_MAX_AGE_S}; HttpOnly; Secure; SameSite=Strict"
    );
    see_ui(&cookie)
}

fn signed_out() -> Response {
    see_ui(&format!(
        "{TOKEN_COOKIE}=; Path=/ui; Max-Age=0; HttpOnly; Secure; SameSite=Strict"
    ))
}

fn see_ui(cookie: &str) -> Response {
    let mut response = (StatusCode::SEE_OTHER, "").into_response();
    let headers = response.headers_mut();
    headers.insert(header::LOCATION, HeaderValue::from_static("/ui"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Ok(v) = HeaderValue::from_str(cookie) {
        headers.insert(header::SET_COOKIE, v);
    }
    response
}

/// Whether a form post comes from the map's own page: a browser names the page's origin
/// (`Origin`), which must be this host; a post without `Origin` (curl, old browsers)
/// is let through, as the cookie's SameSite=Strict already keeps other sites' posts from
/// carrying it.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let origin_host = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .unwrap_or_default();
    !host.is_empty() && origin_host.eq_ignore_ascii_case(host)
}

/// `token=...` of a urlencoded form.
fn form_token(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Form {
        token: String,
    }
    let form: Form = serde_urlencoded::from_bytes(body).ok()?;
    Some(form.token.trim().to_string())
}

/// A token that can stand in a cookie as it is (JWTs and the API server's static tokens).
fn is_cookie_safe(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= 16 * 1024
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.~+/=:".contains(&b))
}

type Check = Arc<dyn Fn(Access) -> BoxFuture<'static, bool> + Send + Sync>;

/// The user a guarded request came from, for handlers that show only what the user may
/// see (the map: pods of the namespaces the user may `list pods` in).
#[derive(Clone)]
pub struct Viewer {
    pub user: User,
    check: Check,
}

/// The namespaces whose pods a viewer sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Visible {
    All,
    Only(BTreeSet<String>),
}

impl Visible {
    pub fn sees(&self, namespace: &str) -> bool {
        match self {
            Visible::All => true,
            Visible::Only(set) => set.contains(namespace),
        }
    }
}

impl Viewer {
    /// Which of `namespaces` the viewer may `list pods` in (all, when allowed cluster-wide).
    pub async fn visible<'n>(&self, namespaces: impl IntoIterator<Item = &'n str>) -> Visible {
        if (self.check)(Access::list_pods("")).await {
            return Visible::All;
        }
        let names: BTreeSet<String> = namespaces.into_iter().map(str::to_string).collect();
        let seen = futures::stream::iter(names)
            .map(|ns| {
                let check = Arc::clone(&self.check);
                async move {
                    let allowed = check(Access::list_pods(&ns)).await;
                    allowed.then_some(ns)
                }
            })
            .buffer_unordered(NAMESPACE_REVIEWS_AT_ONCE)
            .filter_map(std::future::ready)
            .collect()
            .await;
        Visible::Only(seen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_token_comes_from_the_header_else_the_maps_cookie() {
        let bearer = headers(&[("authorization", "bearer abc.def")]);
        assert_eq!(token(&bearer, "/metrics").as_deref(), Some("abc.def"));
        let basic = headers(&[("authorization", "Basic dXNlcjpwdw==")]);
        assert_eq!(token(&basic, "/metrics"), None, "only bearer tokens");
        let cookie = headers(&[("cookie", "a=1; gpuplace-token=t0k; b=2")]);
        assert_eq!(token(&cookie, "/ui/api/fleet").as_deref(), Some("t0k"));
        assert_eq!(
            token(&cookie, "/metrics"),
            None,
            "the cookie is the map's only"
        );
        assert_eq!(
            token(&headers(&[("cookie", "gpuplace-token=")]), "/ui"),
            None
        );
        assert_eq!(verb(&Method::GET), "get");
        assert_eq!(verb(&Method::HEAD), "get");
        assert_eq!(verb(&Method::POST), "create");
    }

    #[test]
    fn form_posts_from_another_site_are_told_apart() {
        let same = headers(&[
            ("host", "127.0.0.1:9401"),
            ("origin", "https://127.0.0.1:9401"),
        ]);
        assert!(same_origin(&same));
        let other = headers(&[
            ("host", "127.0.0.1:9401"),
            ("origin", "https://evil.example"),
        ]);
        assert!(!same_origin(&other));
        assert!(!same_origin(&headers(&[("origin", "null"), ("host", "x")])));
        assert!(same_origin(&headers(&[("host", "x")])), "no Origin: curl");
    }

    #[test]
    fn only_plain_tokens_go_into_the_cookie() {
        assert!(is_cookie_safe("eyJhbGciOi.eyJhdWQi.lT5x-_"));
        assert!(!is_cookie_safe("a; Path=/"));
        assert!(!is_cookie_safe("a\r\nSet-Cookie: x=1"));
        assert!(!is_cookie_safe(""));
        assert_eq!(form_token(b"token=%20abc%20").as_deref(), Some("abc"));
        assert_eq!(form_token(b"other=1"), None);
    }

    proptest! {
        #[test]
        fn any_form_or_header_is_read_without_a_panic(
            body in proptest::collection::vec(any::<u8>(), 0..512),
            value in "\\PC{0,200}",
        ) {
            let _ = form_token(&body);
            if let Ok(v) = HeaderValue::from_str(&value) {
                let mut h = HeaderMap::new();
                h.insert(header::AUTHORIZATION, v.clone());
                h.insert(header::COOKIE, v);
                let _ = token(&h, "/ui");
            }
        }
    }
}
