//! Arbitrary methods, paths and `Authorization` values through BodyLimit,
//! BearerAuth and KeyRoutes: nothing panics, a management key never reaches
//! the upstream, a normal key never reaches the management API (beyond its
//! own account's provider keys, whose answers show only hints), and no
//! request without a valid key gets past BearerAuth.
#![no_main]

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use libfuzzer_sys::fuzz_target;
use modelgate::api::KeyRoutesLayer;
use modelgate::auth::BearerAuthLayer;
use modelgate::body::BodyLimitLayer;
use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
use modelgate::store::MemoryStore;
use tokio::runtime::Runtime;
use tower::{service_fn, ServiceBuilder, ServiceExt};

/// The upstream answers with this status, so reaching it shows.
const UPSTREAM_STATUS: u16 = 299;

struct World {
    runtime: Runtime,
    directory: KeyDirectory,
    admin: String,
    user: String,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let store: SharedStore = Arc::new(MemoryStore::new());
        let directory = KeyDirectory::new(store);
        let (admin, user) = runtime.block_on(async {
            let admin = NewKey {
                management: true,
                ..NewKey::named("admin")
            };
            let (admin, _) = directory.create_key(admin).await.unwrap();
            let (user, _) = directory.create_key(NewKey::named("user")).await.unwrap();
            (admin.expose().to_owned(), user.expose().to_owned())
        });
        World {
            runtime,
            directory,
            admin,
            user,
        }
    })
}

fuzz_target!(|input: (u8, u8, &str, &[u8])| {
    let (method, who, path, body) = input;
    let world = world();
    let method = [
        Method::GET,
        Method::POST,
        Method::PATCH,
        Method::DELETE,
        Method::HEAD,
        Method::PUT,
    ][usize::from(method) % 6]
        .clone();
    let authorization = match who % 4 {
        0 => Some(format!("Bearer {}", world.admin)),
        1 => Some(format!("Bearer {}", world.user)),
        2 => Some(path.to_owned()),
        _ => None,
    };
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    if let Some(authorization) = &authorization {
        request = request.header("authorization", authorization.as_str());
    }
    let Ok(request) = request.body(Full::new(Bytes::copy_from_slice(body))) else {
        return;
    };
    let service = ServiceBuilder::new()
        .layer(BodyLimitLayer::new())
        .layer(BearerAuthLayer::new(world.directory.clone()))
        .layer(KeyRoutesLayer::new(world.directory.clone()))
        .service(service_fn(|_: Request<Full<Bytes>>| async {
            let mut response = Response::new(Full::new(Bytes::new()));
            *response.status_mut() = http::StatusCode::from_u16(UPSTREAM_STATUS).unwrap();
            Ok::<_, Infallible>(response)
        }));
    let (status, body) = world.runtime.block_on(async {
        let response = service.oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        (
            status,
            response.into_body().collect().await.unwrap().to_bytes(),
        )
    });
    match who % 4 {
        0 => assert_ne!(
            status, UPSTREAM_STATUS,
            "a management key reached the upstream"
        ),
        1 => {
            // Only its own queries and its account's provider keys answer
            // 2xx; the key list and creation never do, and no answer holds
            // a key or a key's hash.
            if (200..300).contains(&status) && status != UPSTREAM_STATUS {
                let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let data = &answer["data"];
                let records = data
                    .as_array()
                    .cloned()
                    .unwrap_or_else(|| vec![data.clone()]);
                let text = String::from_utf8_lossy(&body);
                assert!(answer.get("key").is_none(), "{text}");
                for record in records {
                    assert!(
                        record.get("hash").is_none() && record.get("key").is_none(),
                        "{text}"
                    );
                }
            }
        }
        _ => assert!(
            matches!(status, 400 | 401 | 408 | 413 | 422),
            "{status} without a key"
        ),
    }
});
