use std::sync::Arc;
use std::task::{Context, Poll};

use chrono::SecondsFormat;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use tower_service::Service;

use super::future::ResponseFuture;
use super::layer::CreditGuardConfig;
use super::meter::Meter;
use super::pricing::TokenPrice;
use super::usage::BodyKind;
use crate::auth::Principal;
use crate::body::{is_chat_completions_call, ChatRequest};
use crate::error::{ErrorKind, GatewayError, LimitSource};
use crate::keys::credits::nanos_to_json;
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
                        "the model {} has no price on this gateway; use a listed model or ask the operator to price it",
                        chat.model_id
                    ),
                )
                .with_metadata("param", "model"),
            );
        };
        let kind = if chat.stream {
            BodyKind::EventStream
        } else {
            BodyKind::Json
        };
        let byok = config
            .byok_providers
            .get(&principal.account_id)
            .is_some_and(|providers| {
                providers
                    .iter()
                    .any(|provider| chat.model_id.provider().eq_ignore_ascii_case(provider))
            });
        let reservation = ReserveRequest {
            account: principal.account_id.clone(),
            key: principal.key_hash.to_hex(),
            reservation_id: new_reservation_id(),
            amount_nanos: estimate_max_cost_nanos(chat, &price, config.default_max_tokens),
            key_limit: principal.key_limit,
            check_balance: true,
            ttl: config.reservation_ttl,
        };
        let meter = Meter {
            store: config.store.clone(),
            clock: config.clock.clone(),
            account: reservation.account.clone(),
            key: reservation.key.clone(),
            reservation_id: reservation.reservation_id.clone(),
            reserved_nanos: reservation.amount_nanos,
            price,
            byok,
        };
        let config = Arc::clone(config);
        let admitting: BoxFuture<'static, Result<Meter, GatewayError>> =
            Box::pin(async move { admit(&config, reservation, meter).await });
        ResponseFuture::admitting(
            admitting,
            request,
            inner,
            kind,
            self.config.max_scanned_body_bytes,
        )
    }
}

/// The most a request can cost: its prompt, estimated generously at one
/// token per 3 characters plus 4 per message, and `max_tokens` (or the
/// default) completion tokens for each of its `n` choices.
pub fn estimate_max_cost_nanos(
    chat: &ChatRequest,
    price: &TokenPrice,
    default_max_tokens: u64,
) -> i64 {
    let tools_chars = chat.tools.as_ref().map_or(0, |tools| {
        tools
            .iter()
            .map(|tool| tool.to_string().len())
            .sum::<usize>()
    });
    let prompt_chars = (chat.prompt_chars() + tools_chars) as u64;
    let prompt_tokens = prompt_chars.div_ceil(3) + 4 * chat.messages.len() as u64;
    let completion_tokens = chat
        .max_tokens
        .unwrap_or(default_max_tokens)
        .saturating_mul(chat.n.unwrap_or(1));
    price.cost_nanos(prompt_tokens, completion_tokens)
}

async fn admit(
    config: &CreditGuardConfig,
    reservation: ReserveRequest,
    meter: Meter,
) -> Result<Meter, GatewayError> {
    let now = config.clock.now();
    match config.store.reserve(&reservation, now).await {
        Ok(ReserveOutcome::Reserved { .. }) => Ok(meter),
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
                    "this key has reached its credit limit of {} credits ({} used or held by requests in flight); {when}. Raise the key's limit or use another key",
                    nanos_to_json(limit_nanos),
                    nanos_to_json(used_nanos),
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
                nanos_to_json(balance_nanos)
            ),
        )
        .with_metadata("balance", nanos_to_json(balance_nanos))),
        Err(error) => {
            config.policy.on_store_error("CreditGuard", &error)?;
            // Admitted unchecked: nothing is held, but the cost is still
            // recorded at the end if the store is back by then.
            Ok(Meter {
                reserved_nanos: 0,
                ..meter
            })
        }
    }
}

fn new_reservation_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}
