//! The prices and rate rules of the demo: what `pricing` and
//! `rate_limits` are when the config has none.

/// The prices the demo uses when the config has none: paid models the
/// built-in mock serves, and the free variants it serves.
pub const DEMO_PRICING: &str = r#"{"models": {
    "openai/gpt-4o-mini": {"prompt_per_million": 0.15, "completion_per_million": 0.6, "context_length": 128000},
    "demo/paid": {"prompt_per_million": 1000, "completion_per_million": 1000, "context_length": 128000},
    "openai/text-embedding-3-small": {"prompt_per_million": 0.02, "completion_per_million": 0, "embeddings": true},
    "meta-llama/llama-3.1-8b-instruct:free": {"prompt_per_million": 0, "completion_per_million": 0, "context_length": 131072}
}, "free_models": ["openai/gpt-4o-mini:free"]}"#;

/// The account rule the demo uses when the config has none.
pub const DEMO_RATE_LIMITS: &str =
    r#"{"account": {"gcra": {"requests": 600, "period_seconds": 60, "burst": 60}}}"#;
