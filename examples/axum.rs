//! modelgate's layers on an existing axum router: keys, limits and credits
//! in front of your own chat handler, and the key routes mounted under a
//! prefix of the service's own (`/billing/v2/key`, …).
//!
//! ```sh
//! cargo run --example axum                                   # in memory
//! MODELGATE_STORE=sqlite:demo.db cargo run --example axum    # kept across restarts
//! ```
//!
//! On a durable store a restart makes no new key and gives no more credits:
//! the key and the grant are provisioned once (`ensure_key`, `grant_once`).

use std::sync::Arc;

use axum::routing::post;
use axum::{Extension, Router};
use modelgate::admission::AdmissionLayers;
use modelgate::api::MountedKeyRoutes;
use modelgate::auth::BearerAuthLayer;
use modelgate::body::BodyLimitLayer;
use modelgate::context::RequestContext;
use modelgate::credit::{CreditGuardLayer, PriceTable};
use modelgate::error_mapper::ErrorMapperLayer;
use modelgate::free_quota::FreeModelQuotaLayer;
use modelgate::in_flight::InFlightLimitLayer;
use modelgate::keys::{EnsuredKey, KeyDirectory, NewKey};
use modelgate::rate_limit::{GlobalRateLimitLayer, RateLimitRules};
use modelgate::store::StoreLocation;
use tower::ServiceBuilder;

/// Your handler: it sees who called and what they asked, already checked.
async fn chat(Extension(context): Extension<RequestContext>) -> String {
    // BearerAuth and BodyLimit filled both before any request gets here.
    let (Some(principal), Some(chat)) = (&context.principal, &context.chat) else {
        return String::new();
    };
    serde_json::json!({
        "choices": [{"message": {"role": "assistant", "content": format!("hello, {}", principal.label)}}],
        "model": chat.model,
        "usage": {"prompt_tokens": chat.prompt_chars().div_ceil(4), "completion_tokens": 2},
    })
    .to_string()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let location: StoreLocation = std::env::var("MODELGATE_STORE")
        .unwrap_or_else(|_| "memory".to_owned())
        .parse()?;
    let store = location.open().await?;
    let directory = KeyDirectory::new(store.clone());
    // Made at the first start only; its plaintext is shown that once.
    let key = match directory
        .ensure_key("axum-demo", NewKey::named("axum-demo"))
        .await?
    {
        EnsuredKey::Created(key, _) => key.expose().to_owned(),
        EnsuredKey::Existing(_) => "<the key printed at the first start>".to_owned(),
        EnsuredKey::Deleted(_) => return Err("the demo key was deleted".into()),
    };
    // Once for good, however often the service starts.
    directory
        .grant_once(
            "default",
            10 * modelgate::store::NANOS_PER_CREDIT,
            "initial-grant",
        )
        .await?;
    let prices = PriceTable::from_json(
        r#"{"default": {"prompt_per_million": 1, "completion_per_million": 2}}"#,
    )?;
    let rules = RateLimitRules::from_json(
        r#"{"account": {"rolling": {"requests": 60, "window_seconds": 60}}}"#,
    )?;

    // The key routes under the service's own prefix: GET /billing/v2/key.
    let key_routes = MountedKeyRoutes::new(directory.clone());
    let app = Router::new()
        .route("/api/v1/chat/completions", post(chat))
        .layer(
            ServiceBuilder::new()
                .layer(ErrorMapperLayer::new())
                // The key before the body: no buffering without one.
                .layer(BearerAuthLayer::new(directory.clone()))
                // Past 256 keyed requests at once: 503 at once, not a queue.
                .layer(InFlightLimitLayer::new(256))
                .layer(BodyLimitLayer::new())
                // One atomic admission: a refusal spends no rate, quota or credit.
                .layer(AdmissionLayers::new(
                    GlobalRateLimitLayer::new(store.clone(), rules)?,
                    FreeModelQuotaLayer::new(store.clone()),
                    CreditGuardLayer::new(store, Arc::new(prices)),
                )),
        )
        .nest_service("/billing/v2", key_routes);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!(
        "axum with modelgate on http://{}; try:",
        listener.local_addr()?
    );
    println!(
        "curl -s localhost:3000/api/v1/chat/completions -H 'authorization: Bearer {}' -H 'content-type: application/json' \
         -d '{{\"model\": \"demo/model\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hi\"}}]}}'",
        key
    );
    axum::serve(listener, app).await?;
    Ok(())
}
