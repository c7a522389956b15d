//! OpenTelemetry export of the gateway's spans (feature `otel`): each
//! request's `request` span, with its request id, trace id, key hash
//! prefix, account and model, goes to an OTLP collector over HTTP.
//!
//! ```no_run
//! use tracing_subscriber::layer::SubscriberExt;
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (layer, provider) = modelgate::telemetry::otel::otlp_layer("modelgate", "http://127.0.0.1:4318/v1/traces")?;
//! let subscriber = tracing_subscriber::registry().with(layer);
//! tracing::subscriber::set_global_default(subscriber)?;
//! // … serve …
//! provider.shutdown()?;
//! # Ok(()) }
//! ```

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::registry::LookupSpan;

/// Why the exporter could not be built.
#[derive(Debug, thiserror::Error)]
#[error("OpenTelemetry exporter: {0}")]
pub struct OtelError(String);

/// A `tracing` layer exporting spans to the OTLP/HTTP `endpoint` under
/// `service_name`, and its provider (shut it down to flush on exit).
pub fn otlp_layer<S>(
    service_name: &str,
    endpoint: &str,
) -> Result<
    (
        tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>,
        SdkTracerProvider,
    ),
    OtelError,
>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(endpoint)
        .build()
        .map_err(|error| OtelError(error.to_string()))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name(service_name.to_owned())
                .build(),
        )
        .build();
    let tracer = provider.tracer("modelgate");
    Ok((tracing_opentelemetry::layer().with_tracer(tracer), provider))
}
