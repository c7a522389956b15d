//! modelgate's layers on an existing axum router: keys, limits and credits
//! in front of your own chat handler.
//!
//! ```sh
//! cargo run --example axum
//! ```

use std::sync::Arc;

use axum::routing::post;
use axum::{Extension, Router};
use modelgate::admission::AdmissionLayers;
use modelgate::api::KeyRoutesLayer;
use modelgate::auth::BearerAuthLayer;
use modelgate::body::BodyLimitLayer;
use modelgate::context::RequestContext;
use modelgate::credit::{CreditGuardLayer, PriceTable};
use modelgate::error_mapper::ErrorMapperLayer;
use modelgate::free_quota::FreeModelQuotaLayer;
use modelgate::in_flight::InFlightLimitLayer;
use modelgate::keys::{KeyDirectory, NewKey, SharedStore};
use modelgate::rate_limit::{GlobalRateLimitLayer, RateLimitRules};
use modelgate::store::MemoryStore;
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
    let store: SharedStore = Arc::new(MemoryStore::new());
    let directory = KeyDirectory::new(store.clone());
    let (key, _) = directory.create_key(NewKey::named("axum-demo")).await?;
    store
        .top_up("default", 10 * modelgate::store::NANOS_PER_CREDIT)
        .await?;
    let prices = PriceTable::from_json(
        r#"{"default": {"prompt_per_million": 1, "completion_per_million": 2}}"#,
    )?;
    let rules = RateLimitRules::from_json(
        r#"{"account": {"rolling": {"requests": 60, "window_seconds": 60}}}"#,
    )?;

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
                .layer(KeyRoutesLayer::new(directory))
                // One atomic admission: a refusal spends no rate, quota or credit.
                .layer(AdmissionLayers::new(
                    GlobalRateLimitLayer::new(store.clone(), rules)?,
                    FreeModelQuotaLayer::new(store.clone()),
                    CreditGuardLayer::new(store, Arc::new(prices)),
                )),
        );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!(
        "axum with modelgate on http://{}; try:",
        listener.local_addr()?
    );
    println!(
        "curl -s localhost:3000/api/v1/chat/completions -H 'authorization: Bearer {}' -H 'content-type: application/json' \
         -d '{{\"model\": \"demo/model\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hi\"}}]}}'",
        key.expose()
    );
    axum::serve(listener, app).await?;
    Ok(())
}
