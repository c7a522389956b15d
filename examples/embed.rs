//! An axum service of its own, with modelgate on its one model route.
//!
//! `GET /hello` is the service's and stays untouched; `POST
//! /v1/chat/completions` is gated: keys (modelgate's and the service's own
//! `sk-acme-…` keys, imported by their hash), model names as clients send
//! them (`gpt-4o-mini`, `claude-…`), rate limits and credits. The key API
//! is mounted under `/billing` (`GET /billing/key`, `GET /billing/credits`).
//!
//! ```sh
//! cargo run --features sqlite,axum --example embed                 # state in embed.db
//! MODELGATE_STORE=memory cargo run --features axum --example embed
//! ```
//!
//! Environment: `MODELGATE_STORE` (default `sqlite:embed.db`),
//! `EMBED_LISTEN` (default `127.0.0.1:3000`), `EMBED_IMPORTED_KEY` (a key
//! the service issued before, imported by its hash). On a kept store a
//! restart makes no new key and grants no more credits.

use std::net::SocketAddr;

use axum::routing::{get, post};
use axum::{Extension, Router};
use http::StatusCode;
use http::header::CONTENT_TYPE;
use modelgate::admission::AdmissionLayers;
use modelgate::api::KeyRoutesLayer;
use modelgate::auth::{BearerAuthLayer, ImportedKeys};
use modelgate::body::{BodyLimitLayer, ModelNames};
use modelgate::client_addr::{ClientAddrLayer, TrustedProxies, axum_connect_info};
use modelgate::context::{CheckedStack, RequestContext};
use modelgate::credit::{CreditGuardLayer, PriceTable};
use modelgate::error_mapper::ErrorMapperLayer;
use modelgate::free_quota::FreeModelQuotaLayer;
use modelgate::in_flight::InFlightLimitLayer;
use modelgate::keys::{EnsuredKey, KeyDirectory, KeyHash, NewKey, nanos_from_credits};
use modelgate::rate_limit::{GlobalRateLimitLayer, RateLimitRules, model_calls};
use modelgate::store::StoreLocation;
use modelgate::usage::Generations;
use serde_json::{Value, json};

/// The service's model handler: the caller and the request are checked,
/// and `usage` in the answer is what the caller is charged.
async fn chat(
    Extension(context): Extension<RequestContext>,
) -> (StatusCode, [(http::HeaderName, &'static str); 1], String) {
    let answer = |status: StatusCode, body: Value| {
        (
            status,
            [(CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
    };
    let Some(chat) = &context.chat else {
        return answer(StatusCode::INTERNAL_SERVER_ERROR, json!({}));
    };
    // The service's own refusal: it reaches the client as written, and is
    // charged nothing (an error without usage).
    if chat.model_id.variant() == Some("unsupported") {
        return answer(
            StatusCode::UNPROCESSABLE_ENTITY,
            json!({"detail": "this service does not run that variant"}),
        );
    }
    answer(
        StatusCode::OK,
        json!({
            "object": "chat.completion",
            // The id the service chose: what it prices, limits and records.
            "model": chat.model_id.as_str(),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": chat.prompt_chars().div_ceil(4), "completion_tokens": 1},
        }),
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Warnings (a store that fails, a settlement retried) are tracing events.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let location: StoreLocation = std::env::var("MODELGATE_STORE")
        .unwrap_or_else(|_| "sqlite:embed.db".to_owned())
        .parse()?;
    let store = location.open().await?;
    let directory = KeyDirectory::new(store.clone());

    // Provisioned once: a restart on a kept store makes and grants nothing.
    match directory
        .ensure_key("embed-demo", NewKey::named("embed-demo"))
        .await?
    {
        EnsuredKey::Created(key, _) => println!("key (shown once): {}", key.expose()),
        EnsuredKey::Existing(_) => println!("key: made at an earlier start"),
        EnsuredKey::Deleted(_) => println!("key: deleted; make another with the key API"),
    }
    if let Ok(imported) = std::env::var("EMBED_IMPORTED_KEY") {
        // The service keeps only the hash of the keys it issued.
        let hash = KeyHash::of(&imported);
        directory
            .import_key_hash(hash, NewKey::named("issued-before"))
            .await?;
    }
    directory
        .grant_once("default", nanos_from_credits("10")?, "initial-grant")
        .await?;

    let prices = PriceTable::from_json(
        r#"{"models": {"openai/gpt-4o-mini": {"prompt_per_million": 150, "completion_per_million": 600}},
            "default": {"prompt_per_million": 1000, "completion_per_million": 1000}}"#,
    )?;
    let rules = RateLimitRules::from_json(
        r#"{"account": {"rolling": {"requests": 60, "window_seconds": 60}}}"#,
    )?;
    let names = ModelNames::new()
        .default_provider("acme")?
        .alias("gpt-4o-mini", "openai/gpt-4o-mini")?
        .alias("claude-*", "anthropic/")?;
    let auth = BearerAuthLayer::new(directory.clone())
        .realm("acme")
        .product_name("Acme")
        .imported_keys(ImportedKeys::prefixes(["sk-acme-"]));

    // Checked as it is built: a layer before the one it reads from is an
    // error here, not a 500 on each request.
    let gate = CheckedStack::new()
        .plain(ClientAddrLayer::new(TrustedProxies::none()).peer_from(axum_connect_info))
        .plain(ErrorMapperLayer::for_own_handler())
        .layer(auth.clone())
        .plain(InFlightLimitLayer::new(256))
        .layer(BodyLimitLayer::new().model_names(names))
        .layer(AdmissionLayers::new(
            GlobalRateLimitLayer::new(store.clone(), rules)?.served_routes(model_calls),
            FreeModelQuotaLayer::new(store.clone()),
            // Each charged call leaves a record (GET /billing/generations).
            CreditGuardLayer::new(store, std::sync::Arc::new(prices))
                .generations(Generations::new()),
        ))
        .into_layer()?;

    let app = Router::new()
        .route("/hello", get(|| async { "hello" }))
        .route("/v1/chat/completions", post(chat).route_layer(gate))
        .nest_service("/billing", KeyRoutesLayer::new(directory).mounted(auth));

    let listen = std::env::var("EMBED_LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
