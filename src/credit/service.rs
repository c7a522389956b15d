use std::sync::Arc;
use std::task::{Context, Poll};

use chrono::SecondsFormat;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use tower_service::Service;

use super::future::ResponseFuture;
use super::layer::CreditGuardConfig;
use super::meter::{Ending, Meter, Unsettled};
use super::pricing::TokenPrice;
use crate::auth::Principal;
use crate::body::{is_chat_completions_call, ChatRequest, MessageContent};
use crate::error::{ErrorKind, GatewayError, LimitSource};
use crate::keys::credits::{decimal_string, nanos_to_json};
use crate::keys::ByokCredential;
use crate::response_body::ResponseBody;
use crate::store::{ReserveOutcome, ReserveRequest};

use super::body::MeteredBody;

/// Admits a chat request only when its key is under its credit limit and
/// its account's balance is not negative, holding the request's estimated
/// maximum cost while it runs; records the real cost when the response
/// ends. See the [module docs](super).
///
/// Needs [`BearerAuth`](crate::auth::BearerAuth) and
/// [`BodyLimit`](crate::body::BodyLimit) before it. Requests other than
/// chat completions pass unmetered.
#[derive(Clone, Debug)]
pub struct CreditGuard<S> {
    pub(crate) inner: S,
    pub(crate) config: Arc<CreditGuardConfig>,
}

impl<S, B, ResBody> Service<Request<B>> for CreditGuard<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
{
    type Response = Response<ResponseBody<MeteredBody<ResBody>>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Refused requests never need the inner service.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let Some(chat) = request.extensions().get::<ChatRequest>() else {
            if is_chat_completions_call(request.method(), request.uri().path()) {
                return ResponseFuture::rejected(GatewayError::missing_layer(
                    "CreditGuard",
                    "BodyLimit",
                ));
            }
            return ResponseFuture::unmetered(request, inner);
        };
        let Some(principal) = request.extensions().get::<Principal>() else {
            return ResponseFuture::rejected(GatewayError::missing_layer(
                "CreditGuard",
                "BearerAuth",
            ));
        };
        let config = &self.config;
        let Some(price) = config.pricing.price(&chat.model_id) else {
            return ResponseFuture::rejected(
                GatewayError::new(
                    ErrorKind::InvalidRequest,
                    format!(
                        "the model {} has no price on this gateway; GET /api/v1/models lists the models it serves",
                        chat.model_id
                    ),
                )
                .with_metadata("param", "model"),
            );
        };
        let provider = chat.model_id.provider();
        let byok_by_config = config
            .byok_providers
            .get(&principal.account_id)
            .is_some_and(|providers| {
                providers
                    .iter()
                    .any(|listed| provider.eq_ignore_ascii_case(listed))
            });
        let charge = Charge {
            principal: principal.clone(),
            provider: provider.to_owned(),
            byok_by_config,
            estimate_nanos: estimate_max_cost_nanos(chat, &price, config.default_max_tokens),
            price,
            free: chat.model_id.is_free(),
        };
        let config = Arc::clone(config);
        let admitting: BoxFuture<'static, Result<Admitted, GatewayError>> =
            Box::pin(async move { admit(&config, charge).await });
        ResponseFuture::admitting(
            admitting,
            request,
            inner,
            self.config.max_scanned_body_bytes,
        )
    }
}

/// The most a request can cost: its prompt, estimated generously at one
/// token per 3 bytes of UTF-8 (a CJK character is 3 bytes) plus 4 per
/// message and 1000 per non-text part (an image), tool definitions and
/// other message fields (tool calls) included; and `max_tokens` (or the
/// default) completion tokens for each of its `n` choices.
pub fn estimate_max_cost_nanos(
    chat: &ChatRequest,
    price: &TokenPrice,
    default_max_tokens: u64,
) -> i64 {
    let mut prompt_bytes: u64 = 0;
    let mut other_parts: u64 = 0;
    for message in &chat.messages {
        match &message.content {
            Some(MessageContent::Text(text)) => prompt_bytes += text.len() as u64,
            Some(MessageContent::Parts(parts)) => {
                for part in parts {
                    match part.get("text").and_then(serde_json::Value::as_str) {
                        Some(text) => prompt_bytes += text.len() as u64,
                        None => other_parts += 1,
                    }
                }
            }
            None => {}
        }
        if !message.extra.is_empty() {
            prompt_bytes += serde_json::Value::Object(message.extra.clone())
                .to_string()
                .len() as u64;
        }
    }
    if let Some(tools) = &chat.tools {
        prompt_bytes += tools
            .iter()
            .map(|tool| tool.to_string().len() as u64)
            .sum::<u64>();
    }
    let prompt_tokens =
        prompt_bytes.div_ceil(3) + 4 * chat.messages.len() as u64 + 1000 * other_parts;
    let completion_tokens = chat
        .max_tokens
        .unwrap_or(default_max_tokens)
        .saturating_mul(chat.n.unwrap_or(1));
    price.cost_nanos(prompt_tokens, completion_tokens)
}

/// What admission needs to know of one chat request.
struct Charge {
    principal: Principal,
    /// The model's provider, as the request spells it.
    provider: String,
    /// Whether [`CreditGuardLayer::byok_providers`](super::CreditGuardLayer::byok_providers)
    /// lists the provider for the account.
    byok_by_config: bool,
    estimate_nanos: i64,
    price: TokenPrice,
    free: bool,
}

/// An admitted request's hold, and the account's own key for the
/// provider when it set one.
pub(crate) struct Admitted {
    pub(crate) meter: Meter,
    pub(crate) credential: Option<ByokCredential>,
}

/// Decides whether the request is BYOK (one cached lookup when a
/// [`ByokDirectory`](crate::keys::ByokDirectory) is set), then holds its
/// estimate.
async fn admit(config: &CreditGuardConfig, charge: Charge) -> Result<Admitted, GatewayError> {
    let credential = match &config.byok_directory {
        None => None,
        Some(directory) => match directory
            .lookup(&charge.principal.account_id, &charge.provider)
            .await
        {
            Ok(credential) => credential,
            Err(error) => {
                // Failing open, the request is the account's own usage:
                // without the key no upstream could be sent it anyway.
                config.policy.on_store_error("CreditGuard", &error)?;
                None
            }
        },
    };
    let byok = charge.byok_by_config || credential.is_some();
    let principal = &charge.principal;
    // BYOK usage that does not count against the key's limit neither
    // holds nor is checked against it.
    let counted = !byok || principal.include_byok_in_limit;
    let reservation = ReserveRequest {
        account: principal.account_id.clone(),
        key: principal.key_hash.to_hex(),
        reservation_id: new_reservation_id(),
        amount_nanos: if counted { charge.estimate_nanos } else { 0 },
        key_limit: principal.key_limit.filter(|_| counted),
        check_balance: true,
        ttl: config.reservation_ttl,
    };
    let meter = Meter {
        ledger: config.ledger.clone(),
        account: reservation.account.clone(),
        key: reservation.key.clone(),
        reservation_id: reservation.reservation_id.clone(),
        estimate_nanos: charge.estimate_nanos,
        price: charge.price,
        free: charge.free,
        byok,
        response_success: None,
    };
    let meter = reserve(config, reservation, meter).await?;
    Ok(Admitted { meter, credential })
}

async fn reserve(
    config: &CreditGuardConfig,
    reservation: ReserveRequest,
    meter: Meter,
) -> Result<Meter, GatewayError> {
    // Dropped before the answer (the client left), or a store that failed
    // after it may have held: the hold, if any, is released at no cost.
    let mut pending = Unsettled::new(Some(meter), Ending::NotSent);
    let outcome = config.ledger.reserve(&reservation).await;
    if matches!(
        outcome,
        Ok(ReserveOutcome::KeyLimitReached { .. } | ReserveOutcome::BalanceNegative { .. })
    ) {
        // Refused: nothing was held.
        pending.take();
    }
    match outcome {
        Ok(ReserveOutcome::Reserved { .. }) => Ok(pending.take().expect("armed above")),
        Ok(ReserveOutcome::KeyLimitReached {
            used_nanos,
            limit_nanos,
            resets_at,
        }) => {
            let when = match resets_at {
                Some(resets_at) => format!(
                    "it resets at {}",
                    resets_at.to_rfc3339_opts(SecondsFormat::Secs, true)
                ),
                None => "it never resets".to_owned(),
            };
            let mut error = GatewayError::insufficient_credits(
                LimitSource::KeyLimit,
                format!(
                    "this key's credit limit is {} credits, {} are used or held by requests in flight, and this request could cost more than is left; {when}. Raise the key's limit, lower max_tokens, or use another key",
                    decimal_string(limit_nanos, 0),
                    decimal_string(used_nanos, 0),
                ),
            )
            .with_metadata("limit", nanos_to_json(limit_nanos))
            .with_metadata("used", nanos_to_json(used_nanos));
            if let Some(resets_at) = resets_at {
                error = error.with_metadata(
                    "resets_at",
                    resets_at.to_rfc3339_opts(SecondsFormat::Secs, true),
                );
            }
            Err(error)
        }
        Ok(ReserveOutcome::BalanceNegative { balance_nanos }) => Err(GatewayError::insufficient_credits(
            LimitSource::Credits,
            format!(
                "the account balance is negative ({} credits); top up the account to continue. This applies to free models too",
                decimal_string(balance_nanos, 2)
            ),
        )
        .with_metadata("balance", nanos_to_json(balance_nanos))),
        Err(error) => {
            config.policy.on_store_error("CreditGuard", &error)?;
            // Admitted unchecked: the cost is still recorded at the end
            // (the estimate, when no usage arrives) once the store is back.
            Ok(pending.take().expect("armed above"))
        }
    }
}

fn new_reservation_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estimate(body: &str) -> i64 {
        // One nano per token, both ways.
        let price = TokenPrice {
            prompt_nanos_per_million_tokens: 1_000_000,
            completion_nanos_per_million_tokens: 1_000_000,
        };
        estimate_max_cost_nanos(&ChatRequest::parse(body.as_bytes()).unwrap(), &price, 100)
    }

    #[test]
    fn estimates_are_generous_for_every_kind_of_prompt() {
        // 9 ASCII bytes: 3 tokens, 4 for the message, 100 default completion.
        assert_eq!(
            estimate(r#"{"model": "a/b", "messages": [{"role": "user", "content": "123456789"}]}"#),
            107
        );
        // 3 CJK characters are 9 bytes: at least a token each.
        assert_eq!(
            estimate(r#"{"model": "a/b", "messages": [{"role": "user", "content": "你好吗"}]}"#),
            107
        );
        // An image part counts 1000 tokens; max_tokens × n completions.
        let image = r#"{"model": "a/b", "max_tokens": 10, "n": 2, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "abc"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]}"#;
        assert_eq!(estimate(image), 1 + 4 + 1000 + 20);
        // Tool calls in a message's other fields count too.
        let tool = r#"{"model": "a/b", "max_tokens": 1, "messages": [{"role": "assistant", "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}"#;
        assert!(estimate(tool) > 1 + 4 + 10);
    }
}
