//! An OpenAI-compatible upstream for demos, tests and load runs.
//!
//! ```sh
//! cargo run --example mock_upstream -- --listen 127.0.0.1:9000 --prefix /v1 \
//!     --latency-ms 50 --error-status 503 --error-rate 0.1
//! ```
//!
//! `POST {prefix}/chat/completions` answers a deterministic reply with
//! `usage`; with `"stream": true` it answers SSE: a keep-alive comment,
//! content chunks, a usage chunk and `data: [DONE]`. `{prefix}/messages`
//! (Anthropic), `{prefix}/responses` and `{prefix}/embeddings` (OpenAI)
//! answer as those APIs do. A model named
//! `…/status-NNN` answers status NNN; `…/plain-text` answers `text/plain`.

#[path = "support/args.rs"]
mod args;
#[path = "support/mock.rs"]
mod mock;

use std::time::Duration;

const USAGE: &str = "usage: mock_upstream [--listen ADDR] [--prefix /v1] [--latency-ms N] \
[--error-status CODE] [--error-rate 0..1] [--fail-first N] [--event-delay-ms N]";

#[tokio::main]
async fn main() {
    if let Err(message) = run().await {
        eprintln!("mock_upstream: {message}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), String> {
    let args = args::Args::parse(
        &[
            "listen",
            "prefix",
            "latency-ms",
            "error-status",
            "error-rate",
            "fail-first",
            "event-delay-ms",
        ],
        USAGE,
    )?;
    let listen = args.get("listen").unwrap_or("127.0.0.1:9000").to_owned();
    let config = mock::MockConfig {
        prefix: args
            .get("prefix")
            .unwrap_or("/v1")
            .trim_end_matches('/')
            .to_owned(),
        latency: Duration::from_millis(args.parsed("latency-ms", 0u64)?),
        error_status: args.parsed("error-status", 503u16)?,
        error_rate: args.parsed("error-rate", 0.0f64)?,
        fail_first: args.parsed("fail-first", 0u64)?,
        event_delay: Duration::from_millis(args.parsed("event-delay-ms", 0u64)?),
        ..mock::MockConfig::default()
    };
    if !(0.0..=1.0).contains(&config.error_rate) {
        return Err("--error-rate must be between 0 and 1".to_owned());
    }
    if http::StatusCode::from_u16(config.error_status).is_err() {
        return Err("--error-status must be an HTTP status".to_owned());
    }
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|error| format!("cannot listen on {listen}: {error}"))?;
    let address = listener.local_addr().map_err(|error| error.to_string())?;
    println!(
        "mock upstream listening on http://{address}{}",
        config.prefix
    );
    mock::serve(listener, config).await;
    Ok(())
}
