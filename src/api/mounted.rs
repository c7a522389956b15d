//! [`MountedKeyRoutes`]: the JSON API as a service of its own, answering
//! its paths relative to wherever a service mounts it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_service::Service;

use super::KeyRoutesLayer;
use crate::auth::BearerAuthLayer;
use crate::body::BodyLimitLayer;
use crate::error::{ErrorKind, GatewayError};
use crate::keys::KeyDirectory;
use crate::routing::{is_api_path, path_is};

/// The body of a [`MountedKeyRoutes`] answer.
pub type MountedBody = UnsyncBoxBody<Bytes, BoxError>;

/// The JSON API ([`KeyRoutes`](super::KeyRoutes)' table) as a service to
/// mount under any prefix: it answers each route at its path without
/// `/api/v1` (`GET /key`, `POST /keys`, `GET /accounts/{id}`, …; `GET
/// /user/balance` keeps its path), relative to where it is mounted, so
/// `Router::nest_service("/billing/v2", routes)` serves
/// `GET /billing/v2/key`. Any other path is 404 without a store read.
///
/// It authenticates itself ([`BearerAuth`](crate::auth::BearerAuth), which
/// lets management keys use these routes and nothing else) and reads the
/// body itself ([`BodyLimit`](crate::body::BodyLimit)): mount it beside
/// the routes the layers guard, not behind them. A management key that
/// calls the service's model routes is refused there as before.
/// Errors are the crate's one JSON format.
///
/// ```
/// use std::sync::Arc;
/// use modelgate::api::MountedKeyRoutes;
/// use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
/// use modelgate::store::MemoryStore;
/// use http_body_util::{BodyExt, Empty};
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store: SharedStore = Arc::new(MemoryStore::new());
/// let directory = KeyDirectory::new(store);
/// let (key, _) = directory.create_key(NewKey::named("ci")).await.unwrap();
/// // What a router passes on once it has cut its prefix off.
/// let request = http::Request::get("/key")
///     .header("authorization", format!("Bearer {}", key.expose()))
///     .body(Empty::<bytes::Bytes>::new())
///     .unwrap();
/// let response = MountedKeyRoutes::new(directory).oneshot(request).await.unwrap();
/// let body = response.into_body().collect().await.unwrap().to_bytes();
/// let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
/// assert_eq!(status["data"]["label"], "ci");
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct MountedKeyRoutes {
    routes: KeyRoutesLayer,
    auth: BearerAuthLayer,
    body: BodyLimitLayer,
}

impl MountedKeyRoutes {
    /// The routes of `directory`, authenticated against it, with
    /// [`KeyRoutesLayer::new`]'s defaults.
    /// Lookups of unknown keys are bounded
    /// ([`BearerAuthLayer::max_concurrent_lookups`], [`DEFAULT_CONCURRENT_LOOKUPS`](Self::DEFAULT_CONCURRENT_LOOKUPS)).
    pub fn new(directory: KeyDirectory) -> Self {
        let auth = BearerAuthLayer::new(directory.clone())
            .max_concurrent_lookups(Self::DEFAULT_CONCURRENT_LOOKUPS);
        KeyRoutesLayer::new(directory).mounted(auth)
    }

    /// How many lookups of keys not known live [`new`](Self::new)'s
    /// authentication runs at once: the management API is reachable
    /// without a key, so a flood of made-up keys must not become a flood
    /// of store reads.
    pub const DEFAULT_CONCURRENT_LOOKUPS: usize = 64;

    /// Bodies read as `body` says (default [`BodyLimitLayer::new`]).
    pub fn body_limit(mut self, body: BodyLimitLayer) -> Self {
        self.body = body;
        self
    }
}

impl KeyRoutesLayer {
    /// These routes, as configured, as a service to mount under a prefix
    /// ([`MountedKeyRoutes`]), authenticated by `auth` (give it the
    /// [`AuthFailures`](crate::auth::AuthFailures) the service's other
    /// routes count in).
    pub fn mounted(self, auth: BearerAuthLayer) -> MountedKeyRoutes {
        MountedKeyRoutes {
            routes: self,
            auth,
            body: BodyLimitLayer::new(),
        }
    }
}

/// The path the route table names for `relative`, a path under the mount
/// point: `/user/balance` as it is, any other with `/api/v1` before it;
/// `None` when that is none of the table's paths.
fn table_path(relative: &str) -> Option<String> {
    let path = if path_is(relative, &["user", "balance"]) {
        relative.to_owned()
    } else {
        format!("/api/v1{relative}")
    };
    is_api_path(&path).then_some(path)
}

/// `uri` with the path `path` and its own query.
fn with_path(uri: &Uri, path: &str) -> Option<Uri> {
    let path_and_query = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(PathAndQuery::try_from(path_and_query).ok()?);
    Uri::from_parts(parts).ok()
}

fn not_found() -> Response<MountedBody> {
    GatewayError::new(
        ErrorKind::NotFound,
        "no route of the key API has this path; see the routes this service mounts",
    )
    .to_response::<Full<Bytes>>()
    .map(|body| body.map_err(|never| match never {}).boxed_unsync())
}

impl<B> Service<Request<B>> for MountedKeyRoutes
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<MountedBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let Some(uri) =
            table_path(request.uri().path()).and_then(|path| with_path(request.uri(), &path))
        else {
            return Box::pin(async { Ok(not_found()) });
        };
        // The layers below read the table's own paths: BearerAuth opens
        // exactly those to management keys, KeyRoutes answers them.
        *request.uri_mut() = uri;
        let stack = ServiceBuilder::new()
            .layer(self.auth.clone())
            .layer(self.body.clone())
            .layer(self.routes.clone())
            .service_fn(|_: Request<Full<Bytes>>| async {
                // Every path let through is the table's: KeyRoutes answers it.
                Ok::<_, Infallible>(
                    GatewayError::new(ErrorKind::NotFound, "no such route")
                        .to_response::<Full<Bytes>>(),
                )
            });
        Box::pin(async move {
            let response = stack.oneshot(request).await?;
            Ok(response.map(|body| body.boxed_unsync()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_the_table_s() {
        assert_eq!(table_path("/key").as_deref(), Some("/api/v1/key"));
        assert_eq!(
            table_path("/accounts/acme/credits").as_deref(),
            Some("/api/v1/accounts/acme/credits")
        );
        assert_eq!(
            table_path("/user/balance").as_deref(),
            Some("/user/balance")
        );
        for other in [
            "/",
            "/chat/completions",
            "/api/v1/key",
            "/hello",
            "/keys/a/b/c",
        ] {
            assert_eq!(table_path(other), None, "{other}");
        }
    }

    #[test]
    fn the_query_stays() {
        let uri: Uri = "/keys?offset=100".parse().unwrap();
        assert_eq!(
            with_path(&uri, "/api/v1/keys").unwrap().to_string(),
            "/api/v1/keys?offset=100"
        );
    }
}
