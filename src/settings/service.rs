use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{
    ALLOW, CACHE_CONTROL, CONTENT_TYPE, HeaderValue, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use http::{Method, Request, Response};
use tower_service::Service;

use super::ResponseFuture;
use crate::error::{ErrorKind, GatewayError};
use crate::routing::normalized_segments;

/// Where the page is served.
pub const PATH: &str = "/settings";

/// The `Content-Security-Policy` of every response the page layer writes:
/// everything from the gateway's own origin only, nothing inline, no
/// framing, no form posts, no `<base>`.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Answers `/settings` and the paths under it with the key settings page
/// and its files; passes every other request to the inner service
/// untouched. See the [module docs](super).
///
/// Ready when the inner service is: the requests it passes on call it at
/// once (a limit below it holds its own answers too).
#[derive(Clone, Debug)]
pub struct SettingsPage<S> {
    pub(crate) inner: S,
}

/// A file of the page: its name under `/settings/` (empty for the page
/// itself), its type and its bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

const ASSETS: [Asset; 7] = [
    Asset {
        name: "",
        content_type: "text/html; charset=utf-8",
        bytes: include_bytes!("assets/index.html"),
    },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("assets/app.js"),
    },
    Asset {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("assets/app.css"),
    },
    // The page names its own icon, so the browser never asks for
    // /favicon.ico: without a key, that request would count as a failed
    // authentication against the person's address.
    Asset {
        name: "icon.svg",
        content_type: "image/svg+xml; charset=utf-8",
        bytes: include_bytes!("assets/icon.svg"),
    },
    // The consent page's script (the page itself is `/auth`).
    Asset {
        name: "auth.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("assets/auth.js"),
    },
    // The API client both pages' scripts use.
    Asset {
        name: "api.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("assets/api.js"),
    },
    // The Activity chart's drawing, which app.js calls.
    Asset {
        name: "activity.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("assets/activity.js"),
    },
];

/// The OAuth consent page, served at `/auth` with the settings page's
/// style sheet, icon and headers ([`crate::oauth`]).
const CONSENT_PAGE: Asset = Asset {
    name: "",
    content_type: "text/html; charset=utf-8",
    bytes: include_bytes!("assets/auth.html"),
};

/// What a path under `/settings` names.
enum Target {
    Asset(&'static Asset),
    Missing,
}

/// The target of `path`, or `None` for a path outside `/settings`.
fn target(path: &str) -> Option<Target> {
    let segments = normalized_segments(path);
    let (first, rest) = segments.split_first()?;
    // `/auth` alone; the query (the app's request) is read by its script.
    if rest.is_empty() && first.eq_ignore_ascii_case("auth") {
        return Some(Target::Asset(&CONSENT_PAGE));
    }
    if !first.eq_ignore_ascii_case("settings") {
        return None;
    }
    let name = match rest {
        [] => "",
        [name] => name.as_ref(),
        _ => return Some(Target::Missing),
    };
    Some(
        ASSETS
            .iter()
            .find(|asset| asset.name.eq_ignore_ascii_case(name))
            .map_or(Target::Missing, Target::Asset),
    )
}

/// The answer to `method` on `target`, with the page's security headers.
fn answer(target: Target, method: &Method) -> Response<Bytes> {
    let mut response = match target {
        // HEAD is GET without the body; the server drops the body.
        Target::Asset(asset) if method == Method::GET || method == Method::HEAD => {
            let mut response = Response::new(Bytes::from_static(asset.bytes));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
            response
        }
        Target::Asset(_) => GatewayError::new(
            ErrorKind::MethodNotAllowed,
            "the key settings page answers GET and HEAD only",
        )
        .with_header(ALLOW, HeaderValue::from_static("GET, HEAD"))
        .to_response(),
        Target::Missing => GatewayError::new(
            ErrorKind::NotFound,
            "no such file: the key settings page is at /settings",
        )
        .to_response(),
    };
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // The page and its script must match after an upgrade; nothing to revalidate.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

impl<S, B, ResBody> Service<Request<B>> for SettingsPage<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Response = Response<crate::response_body::ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service's readiness: a request passed on is called at
        // once, with no clone of the services below.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match target(request.uri().path()) {
            Some(target) => {
                let response = answer(target, request.method());
                ResponseFuture::answering(Box::pin(std::future::ready(response)))
            }
            None => ResponseFuture::passing(self.inner.call(request)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};
    use tower::{ServiceExt, service_fn};

    async fn call(method: Method, path: &str) -> Response<Bytes> {
        let page = SettingsPage {
            inner: service_fn(|request: Request<Full<Bytes>>| async move {
                let echo = format!("inner {} {}", request.method(), request.uri());
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(echo))))
            }),
        };
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(Full::default())
            .unwrap();
        let response = page.oneshot(request).await.unwrap();
        let (parts, body) = response.into_parts();
        Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
    }

    fn assert_secured(response: &Response<Bytes>) {
        let headers = response.headers();
        assert_eq!(
            headers["content-security-policy"],
            super::CONTENT_SECURITY_POLICY
        );
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert_eq!(headers["referrer-policy"], "no-referrer");
        assert_eq!(headers["x-frame-options"], "DENY");
        assert_eq!(headers["cache-control"], "no-store");
        assert!(!headers.contains_key("access-control-allow-origin"));
    }

    #[tokio::test]
    async fn serves_the_page_and_its_files_with_their_types() {
        for (path, content_type, starts) in [
            ("/settings", "text/html; charset=utf-8", "<!doctype html>"),
            ("/settings/", "text/html; charset=utf-8", "<!doctype html>"),
            (
                "/Settings/./",
                "text/html; charset=utf-8",
                "<!doctype html>",
            ),
            (
                "/settings/app.js",
                "text/javascript; charset=utf-8",
                "// The key settings page",
            ),
            (
                "/settings/api.js",
                "text/javascript; charset=utf-8",
                "// What the settings page and the OAuth consent page share",
            ),
            (
                "/settings/activity.js",
                "text/javascript; charset=utf-8",
                "// The settings page's Activity chart",
            ),
            ("/settings/app.css", "text/css; charset=utf-8", "/* The key"),
            ("/settings/icon.svg", "image/svg+xml; charset=utf-8", "<svg"),
            (
                "/settings/%61pp.js",
                "text/javascript; charset=utf-8",
                "// The key settings page",
            ),
        ] {
            for method in [Method::GET, Method::HEAD] {
                let response = call(method.clone(), path).await;
                assert_eq!(response.status(), 200, "{method} {path}");
                assert_eq!(response.headers()["content-type"], content_type, "{path}");
                assert!(
                    response.body().starts_with(starts.as_bytes()),
                    "{path}: {:?}",
                    String::from_utf8_lossy(&response.body()[..40])
                );
                assert_secured(&response);
            }
        }
    }

    #[tokio::test]
    async fn other_methods_are_405_and_other_files_404_in_the_canonical_format() {
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::OPTIONS] {
            let response = call(method.clone(), "/settings/app.css").await;
            assert_eq!(response.status(), 405, "{method}");
            assert_eq!(response.headers()["allow"], "GET, HEAD");
            let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
            assert_eq!(body["error"]["type"], "method_not_allowed");
            assert_eq!(body["error"]["code"], 405);
            assert_secured(&response);
        }
        for path in [
            "/settings/index.html",
            "/settings/app.js/x",
            "/settings/../settings/nothing",
            "/settings/.env",
        ] {
            let response = call(Method::GET, path).await;
            assert_eq!(response.status(), 404, "{path}");
            assert_eq!(response.headers()["content-type"], "application/json");
            let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
            assert_eq!(body["error"]["type"], "not_found_error");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("/settings"),
                "{body}"
            );
            assert_secured(&response);
        }
    }

    #[tokio::test]
    async fn everything_else_passes_through_untouched() {
        for (method, path) in [
            (Method::GET, "/"),
            (Method::POST, "/api/v1/chat/completions"),
            (Method::GET, "/settingsx"),
            (Method::GET, "/api/settings"),
            (Method::OPTIONS, "/api/v1/keys"),
        ] {
            let response = call(method.clone(), path).await;
            assert_eq!(response.status(), 200);
            assert_eq!(
                response.body(),
                format!("inner {method} {path}").as_bytes(),
                "{method} {path}"
            );
            assert!(!response.headers().contains_key("content-security-policy"));
        }
    }

    #[test]
    fn the_page_loads_nothing_inline_and_nothing_from_elsewhere() {
        let html = std::str::from_utf8(ASSETS[0].bytes).unwrap();
        // CSP would block these; the page must not depend on them.
        for forbidden in [
            "<style",
            " style=",
            " onclick",
            " onload",
            " onsubmit",
            "javascript:",
            "http:",
            "https:",
        ] {
            assert!(!html.contains(forbidden), "index.html contains {forbidden}");
        }
        let scripts = html.matches("<script").count();
        assert_eq!(
            scripts,
            html.matches(r#"<script src="/settings/api.js" defer></script>"#)
                .count()
                + html
                    .matches(r#"<script src="/settings/activity.js" defer></script>"#)
                    .count()
                + html
                    .matches(r#"<script src="/settings/app.js" defer></script>"#)
                    .count(),
            "every script is the page's own file"
        );
        let script = [ASSETS[1].bytes, ASSETS[5].bytes, ASSETS[6].bytes]
            .map(|bytes| std::str::from_utf8(bytes).unwrap())
            .concat();
        for forbidden in [
            "eval(",
            "new Function",
            "innerHTML",
            "document.write",
            "localStorage",
            "document.cookie",
        ] {
            assert!(!script.contains(forbidden), "app.js contains {forbidden}");
        }
    }

    #[tokio::test]
    async fn the_consent_page_is_served_at_auth_alone_like_the_settings_page() {
        for (path, content_type, starts) in [
            ("/auth", "text/html; charset=utf-8", "<!doctype html>"),
            (
                "/Auth/?callback_url=x",
                "text/html; charset=utf-8",
                "<!doctype html>",
            ),
            (
                "/settings/auth.js",
                "text/javascript; charset=utf-8",
                "// The consent page",
            ),
        ] {
            let response = call(Method::GET, path).await;
            assert_eq!(response.status(), 200, "{path}");
            assert_eq!(response.headers()["content-type"], content_type, "{path}");
            assert!(response.body().starts_with(starts.as_bytes()), "{path}");
            assert_secured(&response);
        }
        let response = call(Method::POST, "/auth").await;
        assert_eq!(response.status(), 405);
        for path in ["/auth/x", "/authorize", "/api/v1/auth/keys"] {
            let response = call(Method::GET, path).await;
            assert_eq!(response.body(), format!("inner GET {path}").as_bytes());
        }
        let html = std::str::from_utf8(CONSENT_PAGE.bytes).unwrap();
        for forbidden in [
            "<style",
            " style=",
            " onclick",
            "javascript:",
            "http:",
            "https:",
        ] {
            assert!(!html.contains(forbidden), "auth.html contains {forbidden}");
        }
        assert_eq!(
            html.matches("<script").count(),
            html.matches(r#"<script src="/settings/api.js" defer></script>"#)
                .count()
                + html
                    .matches(r#"<script src="/settings/auth.js" defer></script>"#)
                    .count(),
        );
        let script = std::str::from_utf8(ASSETS[4].bytes).unwrap();
        for forbidden in [
            "eval(",
            "new Function",
            "innerHTML",
            "document.write",
            "localStorage",
            "document.cookie",
        ] {
            assert!(!script.contains(forbidden), "auth.js contains {forbidden}");
        }
    }
}
