//! The permission matrix, written out once by hand, checked against the
//! real stack (BearerAuth -> BodyLimit -> KeyRoutes over a MemoryStore)
//! for every route, method and kind of caller; and against the table, so
//! that no route goes unlisted.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tower::{ServiceBuilder, ServiceExt, service_fn};

use super::KeyRoutesLayer;
use super::routes::ROUTES;
use crate::auth::BearerAuthLayer;
use crate::body::BodyLimitLayer;
use crate::keys::{KeyDirectory, NewAccount, NewKey, SharedStore};
use crate::store::MemoryStore;

/// Who calls: the operator's key (`O`), the management key of the
/// account `acme` the paths name (`M`), an ordinary key of `acme` (`m`),
/// the management key of another account, `globex` (`X`), an ordinary key
/// of `globex` (`x`), and no key at all.
const CALLERS: [char; 5] = ['O', 'M', 'm', 'X', 'x'];

/// Method, path (`{id}` is `acme`), and the callers let through.
const MATRIX: &[(&str, &str, &str)] = &[
    ("GET", "/api/v1/key", "OMmXx"),
    ("GET", "/api/v1/credits", "OMmXx"),
    ("GET", "/user/balance", "OMmXx"),
    ("GET", "/api/v1/generation", "OMmXx"),
    ("GET", "/api/v1/generations", "OMmXx"),
    ("GET", "/api/v1/activity", "OMX"),
    ("GET", "/api/v1/apps", "OMmXx"),
    ("GET", "/api/v1/keys", "OMX"),
    ("POST", "/api/v1/keys", "OMX"),
    ("GET", "/api/v1/keys/{hash}", "OMX"),
    ("PATCH", "/api/v1/keys/{hash}", "OMX"),
    ("DELETE", "/api/v1/keys/{hash}", "OMX"),
    ("POST", "/api/v1/keys/{hash}/leaked", "OMX"),
    ("POST", "/api/v1/keys/{hash}/rotate", "OMX"),
    #[cfg(feature = "oauth")]
    ("POST", "/api/v1/auth/keys/code", "OMX"),
    ("GET", "/api/v1/accounts", "OMX"),
    ("POST", "/api/v1/accounts", "O"),
    ("GET", "/api/v1/accounts/{id}", "OM"),
    ("POST", "/api/v1/accounts/{id}/credits", "O"),
    ("GET", "/api/v1/accounts/{id}/byok", "OMm"),
    ("PUT", "/api/v1/accounts/{id}/byok/{provider}", "OM"),
    ("DELETE", "/api/v1/accounts/{id}/byok/{provider}", "OM"),
];

/// The 403 reasons of a refused caller class.
const REFUSALS: [&str; 3] = ["management_key_required", "operator_only", "other_account"];

#[test]
fn the_matrix_lists_every_route_of_the_table_and_no_other() {
    let table: BTreeSet<(String, &str)> = ROUTES
        .iter()
        .flat_map(|route| {
            route
                .methods
                .iter()
                .map(|method| (method.to_string(), route.path))
        })
        .collect();
    let matrix: BTreeSet<(String, &str)> = MATRIX
        .iter()
        .map(|(method, path, _)| (method.to_string(), *path))
        .collect();
    assert_eq!(table, matrix);
}

#[tokio::test]
async fn every_caller_is_let_through_or_refused_as_the_matrix_says() {
    let store: SharedStore = Arc::new(MemoryStore::new());
    let directory = KeyDirectory::new(store);
    for id in ["acme", "globex"] {
        let account = NewAccount {
            id: id.to_owned(),
            name: id.to_owned(),
            email: None,
        };
        directory.create_account(account).await.unwrap().unwrap();
    }
    let key = |name: &str, account: Option<&str>, management: bool| NewKey {
        account: account.unwrap_or("default").to_owned(),
        management,
        scoped_to_account: account.is_some() && management,
        ..NewKey::named(name)
    };
    let mut keys = Vec::new();
    for (caller, new) in [
        ('O', key("operator", None, true)),
        ('M', key("acme manager", Some("acme"), true)),
        ('m', key("acme app", Some("acme"), false)),
        ('X', key("globex manager", Some("globex"), true)),
        ('x', key("globex app", Some("globex"), false)),
    ] {
        let (plaintext, _) = directory.create_key(new).await.unwrap();
        keys.push((caller, Some(plaintext.expose().to_owned())));
    }
    keys.push(('-', None));
    let gateway = ServiceBuilder::new()
        .layer(BearerAuthLayer::new(directory.clone()))
        .layer(BodyLimitLayer::new())
        // Every caller calls every route: no rate in the way.
        .layer(KeyRoutesLayer::new(directory).management_rate(None))
        .service(service_fn(|_: Request<Full<Bytes>>| async {
            let mut passed = Response::new(Full::new(Bytes::new()));
            *passed.status_mut() = StatusCode::IM_A_TEAPOT;
            Ok::<_, Infallible>(passed)
        }));
    let call = |method: &str, path: &str, key: Option<&String>| {
        // A hash no key has: a route let through answers 404 or 400, never
        // a change to the keys the other calls use.
        let path = path
            .replace("{hash}", &"ab".repeat(32))
            .replace("{id}", "acme")
            .replace("{provider}", "openai");
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json");
        if let Some(key) = key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        let request = request.body(Full::new(Bytes::from_static(b"{}"))).unwrap();
        let gateway = gateway.clone();
        async move {
            let response = gateway.oneshot(request).await.unwrap();
            let status = response.status();
            let allow = response.headers().get("allow").cloned();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            let body: serde_json::Value =
                serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
            (status, allow, body)
        }
    };
    assert_eq!(CALLERS.len() + 1, keys.len());
    for (method, path, allowed) in MATRIX {
        for (caller, key) in &keys {
            let (status, _, body) = call(method, path, key.as_ref()).await;
            let seen = format!("{caller} {method} {path}: {status} {body}");
            let reason = body["error"]["metadata"]["reason"].as_str();
            if key.is_none() {
                assert_eq!(status, StatusCode::UNAUTHORIZED, "{seen}");
            } else if allowed.contains(*caller) {
                assert!(
                    ![401, 403, 405, 418, 500].contains(&status.as_u16()),
                    "let through, answered by its handler: {seen}"
                );
            } else {
                assert_eq!(status, StatusCode::FORBIDDEN, "{seen}");
                assert!(
                    reason.is_some_and(|reason| REFUSALS.contains(&reason)),
                    "{seen}"
                );
            }
        }
    }
    // Any other method on a route's path is 405, naming the path's
    // methods (HEAD after GET).
    let operator = keys[0].1.as_ref();
    let paths: BTreeSet<&str> = MATRIX.iter().map(|(_, path, _)| *path).collect();
    for path in paths {
        let mut allow = Vec::new();
        for (method, _, _) in MATRIX.iter().filter(|(_, other, _)| *other == path) {
            allow.push(*method);
            if *method == "GET" {
                allow.push("HEAD");
            }
        }
        let (status, header, body) = call(Method::OPTIONS.as_str(), path, operator).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{path}: {body}");
        assert_eq!(header.unwrap(), allow.join(", ").as_str(), "{path}");
    }
}
