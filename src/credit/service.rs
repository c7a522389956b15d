use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use futures_util::future::BoxFuture;
use http::{Request, Response};
use tower_service::Service;

use super::bound::{BodyEdits, BoundField};
use super::future::ResponseFuture;
use super::layer::CreditGuardConfig;
use super::meter::{Ending, Meter, Unsettled};
use super::pricing::{PromptBounds, TokenPrice};
use crate::body::{ChatRequest, MessageContent};
use crate::context::{
    MessagesEndpoint, ModelApi, ModelCall, ModelId, Principal, PromptSize, RequestContext,
    SentUpstream,
};
use crate::error::{ErrorKind, GatewayError, LimitSource};
use crate::json_input::{bad_request, json_bytes};
use crate::keys::credits::{decimal_string, nanos_to_json};
use crate::keys::{ByokCredential, KeyHash};
use crate::limiter::Verdict;
use crate::limiter::{Admission, AdmissionPlan};
use crate::response_body::ResponseBody;
use crate::routing::{MessagesCall, is_model_call, messages_call};
use crate::store::{AdmitRequest, KeyLimit, PurchaseTier, ReserveOutcome, ReserveRequest};
use crate::store::{RecordKeeping, is_lapse_model};
use crate::usage::GenerationContext;

use super::body::MeteredBody;

/// Admits a chat request only when what its key's limit and (for a paid
/// model) its account's balance leave pays for it, holding what it can
/// cost while it runs: its prompt and the completion bound it goes
/// upstream with. Records the real cost when the response ends. See the
/// [module docs](super).
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
    B: From<Bytes>,
{
    type Response = Response<ResponseBody<MeteredBody<ResBody>>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Refused requests never need the inner service.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        // The checks of the layers before, when they defer to this one.
        let plan = request
            .extensions_mut()
            .get_mut::<RequestContext>()
            .map(|context| std::mem::take(&mut context.plan))
            .unwrap_or_default();
        let context = RequestContext::of(&request);
        let principal = context.and_then(|context| context.principal.as_ref());
        // A Messages `count_tokens` generates nothing: only its checks count.
        let asked = context.and_then(|context| asked_of(context, &self.config));
        let Some((call, asked)) = asked else {
            let (method, path) = (request.method(), request.uri().path());
            let counts_nothing = messages_call(method, path) == Some(MessagesCall::CountTokens);
            if is_model_call(method, path) && !counts_nothing {
                return ResponseFuture::rejected(GatewayError::missing_layer(
                    "CreditGuard",
                    "BodyLimit",
                ));
            }
            let (false, Some(principal)) = (plan.parts.is_empty(), principal) else {
                return ResponseFuture::unmetered(request, inner);
            };
            // Not metered, but the checks handed over are decided here.
            let config = Arc::clone(&self.config);
            let account = principal.account_id.clone();
            let admitting = Box::pin(async move { admit(&config, account, None, plan).await });
            return ResponseFuture::admitting(admitting, request, inner, 0);
        };
        let Some(principal) = principal else {
            return ResponseFuture::rejected(GatewayError::missing_layer(
                "CreditGuard",
                "BearerAuth",
            ));
        };
        let config = &self.config;
        let Some(price) = config.pricing.price(call.model_id) else {
            return ResponseFuture::rejected(
                GatewayError::new(
                    ErrorKind::InvalidRequest,
                    match config.models_route {
                        Some(route) => format!(
                            "the model {} has no price on this gateway; {route} lists the models it serves",
                            call.model_id
                        ),
                        None => format!(
                            "the model {} has no price on this service; send a model it serves",
                            call.model_id
                        ),
                    },
                )
                .with_metadata("param", "model"),
            );
        };
        // An embeddings model embeds, and nothing else does.
        let embeddings_call = call.api == ModelApi::Embeddings;
        if price.embeddings_only != embeddings_call {
            let message = match embeddings_call {
                true => format!(
                    "the model {} is not an embeddings model on this gateway; send an embeddings model, or call it on a completion route",
                    call.model_id
                ),
                false => format!(
                    "the model {} is an embeddings model: call it with a POST to the embeddings route (a path ending in /embeddings)",
                    call.model_id
                ),
            };
            return ResponseFuture::rejected(
                GatewayError::new(ErrorKind::InvalidRequest, message)
                    .with_metadata("param", "model"),
            );
        }
        let provider: Arc<str> = Arc::from(call.model_id.provider());
        let model: Arc<str> = Arc::from(call.model_id.as_str());
        let generation = match &config.generations {
            Some(settings) => {
                // A malformed app header is refused before anything counts.
                let app = match crate::usage::app_from_headers(request.headers()) {
                    Ok(app) => app,
                    Err(error) => return ResponseFuture::rejected(error),
                };
                let requested_model = context
                    .and_then(|context| context.requested_model.clone())
                    .unwrap_or_else(|| call.model_id.as_str().to_owned());
                Some(Box::new(GenerationContext {
                    settings: Arc::clone(settings),
                    app,
                    api: call.api.as_str(),
                    requested_model,
                    model: Arc::clone(&model),
                    provider: Arc::clone(&provider),
                    created_at: config.clock.now(),
                    started: tokio::time::Instant::now(),
                    sent: None,
                    status: None,
                    streamed: false,
                }))
            }
            None => None,
        };
        // Boxed: the admission's futures hold it across their awaits, and
        // a future is moved whole at each step.
        let charge = Box::new(Charge {
            generation,
            key: ChargedKey::of(principal),
            auth_words: request
                .extensions()
                .get::<Arc<crate::auth::AuthWords>>()
                .cloned(),
            model,
            api: call.api,
            prompt_tokens: asked.prompt.tokens,
            likely_prompt_tokens: asked.prompt.likely_tokens,
            unbounded_prompt: asked.prompt.unbounded,
            client_bound_tokens: asked.client_bound_tokens,
            min_bound_tokens: asked.min_bound_tokens,
            choices: asked.choices,
            ask_stream_usage: asked.ask_stream_usage,
            bound_field: asked.bound_field,
            max_tool_calls: asked.max_tool_calls,
            stateless: asked.stateless,
            default_bound_tokens: config.default_max_tokens.max(asked.min_bound_tokens),
            // Each search the request may make has its fee.
            fixed_nanos: i64::try_from(
                i128::from(asked.web_searches)
                    .saturating_mul(i128::from(price.web_search_nanos.max(0))),
            )
            .unwrap_or(i64::MAX),
            provider,
            price: Arc::new(price),
            free: call.model_id.is_free(),
        });
        let config = Arc::clone(config);
        let account = principal.account_id.clone();
        let admitting: BoxFuture<'static, Result<Admitted, GatewayError>> =
            Box::pin(async move { admit(&config, account, Some(charge), plan).await });
        ResponseFuture::admitting(
            admitting,
            request,
            inner,
            self.config.max_scanned_body_bytes,
        )
    }
}

/// What a model call asks of its hold, whichever API it speaks.
struct AskedOf {
    prompt: PromptCount,
    /// The completion bound the client set, if any.
    client_bound_tokens: Option<u64>,
    /// The least bound the request can go with.
    min_bound_tokens: u64,
    choices: u64,
    ask_stream_usage: bool,
    /// The field the bound goes in; `None` for a call that generates
    /// nothing (embeddings).
    bound_field: Option<BoundField>,
    /// The most web searches the request may make, each with its fee.
    web_searches: u64,
    /// `max_tool_calls` to write: the web searches held for.
    max_tool_calls: Option<u64>,
    /// `store: false` to write where the client left it out.
    stateless: bool,
}

/// The model call `context` makes and what it asks of its hold; `None`
/// for a request that calls no model (a Messages `count_tokens` included:
/// it generates nothing, so only its checks count).
fn asked_of<'a>(
    context: &'a RequestContext,
    config: &CreditGuardConfig,
) -> Option<(ModelCall<'a>, AskedOf)> {
    let call = context.model_call()?;
    let bounds = config.pricing.prompt_bounds(call.model_id);
    let asked = match (&context.chat, &context.messages) {
        (Some(chat), _) => AskedOf {
            prompt: count_prompt(chat, &bounds),
            client_bound_tokens: chat.max_tokens,
            min_bound_tokens: 1,
            choices: chat.n.unwrap_or(1).max(1),
            ask_stream_usage: chat.stream && !chat.stream_usage_requested,
            bound_field: Some(
                config
                    .bound_fields
                    .get(&call.model_id.provider().to_ascii_lowercase())
                    .copied()
                    .unwrap_or_default(),
            ),
            web_searches: 0,
            max_tool_calls: None,
            stateless: false,
        },
        (None, Some(messages)) if messages.endpoint == MessagesEndpoint::Create => AskedOf {
            prompt: count_measured_prompt(messages.prompt_size(), call.model_id, &bounds),
            client_bound_tokens: messages.max_tokens,
            // Thinking counts inside `max_tokens`, which must be above
            // its budget.
            min_bound_tokens: messages
                .thinking_budget_tokens()
                .map_or(1, |budget| budget.saturating_add(1)),
            choices: 1,
            // Anthropic's streams always carry their usage.
            ask_stream_usage: false,
            bound_field: Some(BoundField::MaxTokens),
            web_searches: messages.web_search_max_uses().unwrap_or(0),
            max_tool_calls: None,
            stateless: false,
        },
        (None, None) => match (&context.responses, &context.embeddings) {
            (Some(responses), _) => AskedOf {
                prompt: count_measured_prompt(responses.prompt_size(), call.model_id, &bounds),
                client_bound_tokens: responses.max_output_tokens,
                // Reasoning counts inside `max_output_tokens`.
                min_bound_tokens: 1,
                choices: 1,
                // Its last event always carries the usage.
                ask_stream_usage: false,
                bound_field: Some(BoundField::MaxOutputTokens),
                web_searches: responses.web_search_max_uses().unwrap_or(0),
                max_tool_calls: responses.max_tool_calls_to_add(),
                stateless: true,
            },
            (None, Some(embeddings)) => {
                let capped = |tokens: u64| {
                    bounds
                        .context_length_tokens
                        .map_or(tokens, |context| tokens.min(context))
                };
                let tokens = capped(embeddings.prompt_bound_tokens());
                AskedOf {
                    prompt: PromptCount {
                        tokens,
                        likely_tokens: tokens,
                        unbounded: None,
                    },
                    // Nothing is generated.
                    client_bound_tokens: Some(0),
                    min_bound_tokens: 0,
                    choices: 1,
                    ask_stream_usage: false,
                    bound_field: None,
                    web_searches: 0,
                    max_tool_calls: None,
                    stateless: false,
                }
            }
            (None, None) => return None,
        },
        _ => return None,
    };
    Some((call, asked))
}

/// Tokens counted for each message beside its content, and once more for
/// the reply's header: a chat template's markers and the role's name (the
/// longest, `developer`, is 9 bytes), at a token each.
pub const MESSAGE_OVERHEAD_TOKENS: u64 = 16;

/// The most tokens the prompt can count, whatever the upstream's tokenizer:
/// the hold covers this, so an estimate short of the real prompt would be
/// money the balance could not cover.
///
/// Text counts one token per byte of UTF-8 (no tokenizer makes more tokens
/// than bytes), and each message [`MESSAGE_OVERHEAD_TOKENS`] more, the
/// reply's header too; tool definitions, a response format, a message's
/// other fields (tool calls, names) and other top-level fields count by
/// their JSON size. A part that is not text counts the model's bound
/// ([`PromptBounds`]): an image (`image_url`) its `max_tokens_per_image`, a
/// file (`file`) or audio (`input_audio`) its `max_tokens_per_file`, else,
/// and for any other kind of part, its `context_length`. With a
/// `context_length`, the prompt counts at most that: the upstream reads no
/// more.
///
/// A part the bounds cannot bound is refused: 400, `metadata.reason`
/// `unbounded_prompt_part`, whose `metadata.param` names the pricing field
/// to set. [`CreditGuard`] refuses it only when the prompt holds credits:
/// not for a `:free` model, a model whose prompt tokens cost nothing, or a
/// BYOK request its key's limit does not count.
///
/// ```
/// use modelgate::body::ChatRequest;
/// use modelgate::credit::{estimate_prompt_tokens, PromptBounds, MESSAGE_OVERHEAD_TOKENS};
///
/// let chat = ChatRequest::parse(r#"{"model": "a/b", "messages": [{"role": "user", "content": [
///     {"type": "text", "text": "Qu'est-ce que c'est ?"},
///     {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}"#.as_bytes()).unwrap();
/// let bounds = PromptBounds { max_tokens_per_image: Some(1445), ..PromptBounds::default() };
/// // 21 bytes of text, one message and the reply's header, one image.
/// assert_eq!(estimate_prompt_tokens(&chat, &bounds).unwrap(), 21 + 2 * MESSAGE_OVERHEAD_TOKENS + 1445);
/// let error = estimate_prompt_tokens(&chat, &PromptBounds::default()).unwrap_err();
/// assert_eq!(error.status(), 400);
/// assert!(error.message().contains("max_tokens_per_image"));
/// ```
pub fn estimate_prompt_tokens(
    chat: &ChatRequest,
    bounds: &PromptBounds,
) -> Result<u64, GatewayError> {
    let prompt = count_prompt(chat, bounds);
    match prompt.unbounded {
        Some(error) => Err(error),
        None => Ok(prompt.tokens),
    }
}

/// A prompt's count ([`estimate_prompt_tokens`]), and the refusal of its
/// first part the bounds cannot bound, if any. Such a part counts its JSON
/// size here: a figure for the records of a request whose prompt holds
/// nothing, never a bound.
struct PromptCount {
    /// The bound the hold covers: a token per byte of text.
    tokens: u64,
    /// What a request that reports no usage is charged for its prompt: its
    /// text at a token per 3 bytes, as a stream's text is counted
    /// ([`UsageScanner`](super::UsageScanner)), 4 tokens a message, parts at
    /// their bound; never above `tokens`.
    likely_tokens: u64,
    unbounded: Option<GatewayError>,
}

fn count_prompt(chat: &ChatRequest, bounds: &PromptBounds) -> PromptCount {
    let mut unbounded = None;
    // Text (and JSON the upstream reads as text), in bytes; apart from the
    // non-text parts' bounds, in tokens.
    let mut text_bytes: u64 = 0;
    let mut part_tokens: u64 = 0;
    for (message_index, message) in chat.messages.iter().enumerate() {
        match &message.content {
            Some(MessageContent::Text(text)) => {
                text_bytes = text_bytes.saturating_add(text.len() as u64)
            }
            Some(MessageContent::Parts(parts)) => {
                for (part_index, part) in parts.iter().enumerate() {
                    match part_size(part, bounds) {
                        Ok(PartSize::Bytes(bytes)) => text_bytes = text_bytes.saturating_add(bytes),
                        Ok(PartSize::Tokens(tokens)) => {
                            part_tokens = part_tokens.saturating_add(tokens)
                        }
                        Err(missing) => {
                            unbounded.get_or_insert_with(|| {
                                unbounded_part(chat, message_index, part_index, part, missing)
                            });
                            text_bytes = text_bytes.saturating_add(json_bytes(part));
                        }
                    }
                }
            }
            None => {}
        }
        if !message.extra.is_empty() {
            text_bytes = text_bytes.saturating_add(json_bytes(&message.extra));
        }
    }
    for value in chat
        .tools
        .iter()
        .flatten()
        .chain(chat.response_format.iter())
    {
        text_bytes = text_bytes.saturating_add(json_bytes(value));
    }
    if !chat.extra.is_empty() {
        text_bytes = text_bytes.saturating_add(json_bytes(&chat.extra));
    }
    let capped = |tokens: u64| {
        bounds
            .context_length_tokens
            .map_or(tokens, |context| tokens.min(context))
    };
    let messages = chat.messages.len() as u64;
    // The reply's header counts as a message.
    let overhead = |per_message: u64| per_message.saturating_mul(messages.saturating_add(1));
    PromptCount {
        tokens: capped(
            text_bytes
                .saturating_add(part_tokens)
                .saturating_add(overhead(MESSAGE_OVERHEAD_TOKENS)),
        ),
        likely_tokens: capped(
            text_bytes
                .div_ceil(3)
                .saturating_add(part_tokens)
                .saturating_add(overhead(LIKELY_MESSAGE_OVERHEAD_TOKENS)),
        ),
        unbounded,
    }
}

/// A Messages or Responses request's prompt count, by the rules of
/// [`estimate_prompt_tokens`]: its measured bytes ([`PromptSize`](crate::context::PromptSize))
/// at a token each, each message and the reply's header
/// [`MESSAGE_OVERHEAD_TOKENS`] more; an image its `max_tokens_per_image`, a
/// PDF its `max_tokens_per_file`, a block or a server tool whose cost is not
/// in its bytes the `context_length` (each else the `context_length`; the
/// refusal of the first kind the bounds leave unbounded), all at most the
/// `context_length`.
fn count_measured_prompt(
    size: PromptSize,
    model_id: &ModelId,
    bounds: &PromptBounds,
) -> PromptCount {
    let mut unbounded = None;
    let mut part_tokens: u64 = 0;
    let kinds = [
        (
            size.image_count,
            bounds.max_tokens_per_image,
            MissingBound::Image,
            "an image",
        ),
        (
            size.document_count,
            bounds.max_tokens_per_file,
            MissingBound::File,
            "a PDF document",
        ),
        (
            size.unmeasured_block_count
                .saturating_add(size.server_tool_count),
            None,
            MissingBound::Context,
            "a block or server tool whose size in tokens is not in its bytes",
        ),
    ];
    for (count, own_bound, missing, what) in kinds {
        if count == 0 {
            continue;
        }
        match own_bound.or(bounds.context_length_tokens) {
            Some(each) => part_tokens = part_tokens.saturating_add(count.saturating_mul(each)),
            None => {
                let field = missing.field();
                unbounded.get_or_insert_with(|| {
                    bad_request(
                        field,
                        format!(
                            "the request holds {what}, and this gateway's pricing of {} does not set `{field}`, so what it may cost has no bound and cannot be held; the gateway's operator sets `{field}` in the model's pricing. Send the request without it, or use another model",
                            model_id
                        ),
                    )
                    .with_metadata("reason", "unbounded_prompt_part")
                });
            }
        }
    }
    let capped = |tokens: u64| {
        bounds
            .context_length_tokens
            .map_or(tokens, |context| tokens.min(context))
    };
    // The reply's header counts as a message.
    let overhead =
        |per_message: u64| per_message.saturating_mul(size.message_count.saturating_add(1));
    PromptCount {
        tokens: capped(
            size.measured_bytes
                .saturating_add(part_tokens)
                .saturating_add(overhead(MESSAGE_OVERHEAD_TOKENS)),
        ),
        likely_tokens: capped(
            size.measured_bytes
                .div_ceil(3)
                .saturating_add(part_tokens)
                .saturating_add(overhead(LIKELY_MESSAGE_OVERHEAD_TOKENS)),
        ),
        unbounded,
    }
}

/// The tokens a message's framing likely takes, for a charge made without
/// usage; [`MESSAGE_OVERHEAD_TOKENS`] bounds it for the hold.
const LIKELY_MESSAGE_OVERHEAD_TOKENS: u64 = 4;

/// How one content part counts: its bytes, read as text, or a number of
/// tokens (a non-text part's bound).
enum PartSize {
    Bytes(u64),
    Tokens(u64),
}

/// The pricing field whose absence leaves a part unbounded.
#[derive(Clone, Copy, Debug)]
enum MissingBound {
    Image,
    File,
    Context,
}

impl MissingBound {
    fn field(self) -> &'static str {
        match self {
            MissingBound::Image => "max_tokens_per_image",
            MissingBound::File => "max_tokens_per_file",
            MissingBound::Context => "context_length",
        }
    }
}

/// How one content part counts (see [`estimate_prompt_tokens`]).
fn part_size(part: &serde_json::Value, bounds: &PromptBounds) -> Result<PartSize, MissingBound> {
    let text_bytes = |field: &str| match part.get(field) {
        Some(serde_json::Value::String(text)) => text.len() as u64,
        // Not text as the gateway knows it: whatever the upstream makes
        // of it is in these bytes.
        _ => json_bytes(part),
    };
    match part.get("type").and_then(serde_json::Value::as_str) {
        Some("text") => Ok(PartSize::Bytes(text_bytes("text"))),
        Some("refusal") => Ok(PartSize::Bytes(text_bytes("refusal"))),
        Some("image_url") => bounds
            .max_tokens_per_image
            .or(bounds.context_length_tokens)
            .map(PartSize::Tokens)
            .ok_or(MissingBound::Image),
        Some("file" | "input_audio") => bounds
            .max_tokens_per_file
            .or(bounds.context_length_tokens)
            .map(PartSize::Tokens)
            .ok_or(MissingBound::File),
        _ => bounds
            .context_length_tokens
            .map(PartSize::Tokens)
            .ok_or(MissingBound::Context),
    }
}

/// The 400 of a part whose model's pricing does not bound it.
fn unbounded_part(
    chat: &ChatRequest,
    message_index: usize,
    part_index: usize,
    part: &serde_json::Value,
    missing: MissingBound,
) -> GatewayError {
    let field = missing.field();
    let kind = part
        .get("type")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("?");
    let unset = match missing {
        MissingBound::Context => "no `context_length`".to_owned(),
        _ => format!("neither `{field}` nor `context_length`"),
    };
    bad_request(
        field,
        format!(
            "`messages[{message_index}].content[{part_index}]` is a `{kind}` part, and this gateway's pricing of {} sets {unset}, so what the part may cost has no bound and cannot be held; the gateway's operator sets `{field}` in the model's pricing. Send the request without such parts, or use another model",
            chat.model_id
        ),
    )
    .with_metadata("reason", "unbounded_prompt_part")
}

/// The most a request can cost: its prompt ([`estimate_prompt_tokens`])
/// and `max_tokens` (or the default) completion tokens for each of its `n`
/// choices; the 400 of a prompt `bounds` cannot bound.
pub fn estimate_max_cost_nanos(
    chat: &ChatRequest,
    price: &TokenPrice,
    bounds: &PromptBounds,
    default_max_tokens: u64,
) -> Result<i64, GatewayError> {
    let completion_tokens = chat
        .max_tokens
        .unwrap_or(default_max_tokens)
        .saturating_mul(chat.n.unwrap_or(1));
    Ok(price.cost_nanos(estimate_prompt_tokens(chat, bounds)?, completion_tokens))
}

/// What admission needs of the key a request comes with (the rest of its
/// [`Principal`] is other layers' business).
#[derive(Clone, Copy)]
struct ChargedKey {
    hash: KeyHash,
    limit: Option<KeyLimit>,
    include_byok_in_limit: bool,
    rotated: bool,
}

impl ChargedKey {
    fn of(principal: &Principal) -> ChargedKey {
        ChargedKey {
            hash: principal.key_hash,
            limit: principal.key_limit,
            include_byok_in_limit: principal.include_byok_in_limit,
            rotated: principal.rotated,
        }
    }
}

/// What admission needs to know of one chat request.
struct Charge {
    key: ChargedKey,
    /// BearerAuth's words when the stack set its own: a 401 here speaks them.
    auth_words: Option<Arc<crate::auth::AuthWords>>,
    /// The model asked of the upstream, as the request names it.
    model: Arc<str>,
    /// The API the request speaks.
    api: ModelApi,
    /// What the request's generation record starts from, when kept.
    generation: Option<Box<GenerationContext>>,
    /// The model's provider, as the request spells it.
    provider: Arc<str>,
    /// The prompt's bound, held.
    prompt_tokens: u64,
    /// What the prompt is charged when no usage comes.
    likely_prompt_tokens: u64,
    /// The refusal of a prompt the model's bounds cannot bound, given only
    /// when the prompt holds credits ([`Charge::holds_prompt`]).
    unbounded_prompt: Option<GatewayError>,
    /// The completion bound the client set, if any.
    client_bound_tokens: Option<u64>,
    /// The least bound the request can go with (1, or above a thinking
    /// budget).
    min_bound_tokens: u64,
    /// `n`: every choice may use the whole bound.
    choices: u64,
    /// A stream whose client did not ask for usage: the gateway asks.
    ask_stream_usage: bool,
    /// The field the bound goes in (`None`: nothing is generated).
    bound_field: Option<BoundField>,
    /// `max_tool_calls` to write (the web searches held for).
    max_tool_calls: Option<u64>,
    /// `store: false` to write where the client left it out.
    stateless: bool,
    /// The bound written when the client set none and the hold pays for it.
    default_bound_tokens: u64,
    /// Fees the request may owe whatever its tokens (web searches).
    fixed_nanos: i64,
    price: Arc<TokenPrice>,
    free: bool,
}

impl Charge {
    /// Whether the request's usage counts: always, but BYOK usage only
    /// against a key with `include_byok_in_limit`.
    fn counted(&self, byok: bool) -> bool {
        !byok || self.key.include_byok_in_limit
    }

    /// Whether the prompt's estimate is part of the hold: a counted
    /// request to a model that charges for prompt tokens. Only then must
    /// every part be bounded.
    fn holds_prompt(&self, byok: bool) -> bool {
        self.counted(byok) && !self.free && self.price.charges_prompt()
    }

    /// The most the prompt and `tokens` completion tokens per choice can
    /// cost, with the fees the request may owe.
    fn cost_nanos(&self, tokens: u64) -> i64 {
        self.price
            .cost_nanos(self.prompt_tokens, tokens.saturating_mul(self.choices))
            .saturating_add(self.fixed_nanos)
    }

    /// The most completion tokens per choice that `nanos` pays for with
    /// the prompt, up to `most`; 0 when not even one.
    fn affordable_tokens(&self, nanos: i64, most: u64) -> u64 {
        if self.cost_nanos(most) <= nanos {
            return most;
        }
        // cost_nanos grows with the tokens: the largest that fits.
        let (mut low, mut high) = (0u64, most);
        while low < high {
            let middle = low + (high - low).div_ceil(2);
            if self.cost_nanos(middle) <= nanos {
                low = middle;
            } else {
                high = middle - 1;
            }
        }
        low
    }
}

/// An admitted request: its hold (chat requests), the account's own key
/// for the provider when it set one, what the layers that deferred to this
/// one add, and the request body as it must go upstream.
pub(crate) struct Admitted {
    pub(crate) meter: Option<Meter>,
    pub(crate) credential: Option<ByokCredential>,
    pub(crate) additions: Vec<Admission>,
    pub(crate) body_edits: Option<BodyEdits>,
    /// The gateway asked the upstream for stream usage: hidden from the client.
    pub(crate) hide_stream_usage: bool,
    /// Marked by the upstream client as it sends (when it reports so).
    pub(crate) sent: Option<SentUpstream>,
}

/// Decides the request's admission in one store step: the checks `plan`
/// carries and, for a chat request, its hold (BYOK found first: one cached
/// lookup when a [`ByokDirectory`](crate::keys::ByokDirectory) is set).
async fn admit(
    config: &CreditGuardConfig,
    account: String,
    charge: Option<Box<Charge>>,
    plan: AdmissionPlan,
) -> Result<Admitted, GatewayError> {
    let mut admitted = decide(config, account, charge, plan).await?;
    if config.upstream_reports_sending && admitted.meter.is_some() {
        admitted.sent = Some(SentUpstream::default());
    }
    Ok(admitted)
}

/// The admission proper: see [`admit`].
async fn decide(
    config: &CreditGuardConfig,
    account: String,
    charge: Option<Box<Charge>>,
    plan: AdmissionPlan,
) -> Result<Admitted, GatewayError> {
    let charge_rotated = charge.as_ref().is_some_and(|charge| charge.key.rotated);
    let auth_words = charge.as_ref().and_then(|charge| charge.auth_words.clone());
    let credential = match (&config.byok_directory, &charge) {
        // A key stored for a provider that no longer takes one is not
        // looked up: the request is charged, never BYOK beside the
        // gateway's own credential.
        (Some(directory), Some(charge)) if config.byok_providers.accepts(&charge.provider) => {
            match directory.lookup(&account, &charge.provider).await {
                Ok(credential) => credential,
                Err(error) => {
                    // Failing open, the request is the account's own usage:
                    // without the key no upstream could be sent it anyway.
                    config.policy.on_store_error("CreditGuard", &error)?;
                    None
                }
            }
        }
        _ => None,
    };
    // BYOK only when the account's own key goes upstream with the request.
    let byok = credential.is_some();
    let mut charge = charge;
    if let Some(charge) = charge.as_mut().filter(|charge| charge.holds_prompt(byok)) {
        // Before anything counts (rates, quotas, the hold): a prompt the
        // hold cannot bound is refused.
        if let Some(error) = charge.unbounded_prompt.take() {
            return Err(error);
        }
    }
    let (hold, meter) = charge
        .as_mut()
        .map(|charge| hold_request(config, &account, charge, byok))
        .unzip();
    let mut checks = Vec::new();
    let mut purchase_tier = None;
    let mut ranges = Vec::with_capacity(plan.parts.len());
    for part in &plan.parts {
        let start = checks.len();
        if let Some(tier) = part.tier {
            purchase_tier = Some(PurchaseTier {
                check_index: start + tier.check_index,
                ..tier
            });
        }
        checks.extend(part.checks.iter().cloned());
        ranges.push(start..checks.len());
    }
    let request = AdmitRequest {
        account,
        checks,
        purchase_tier,
        hold,
    };
    // Dropped before the answer (the client left), or a store that failed
    // after it may have held: the hold, if any, is released at no cost.
    let mut pending = Unsettled::new(meter, Ending::NotSent);
    let outcome = match config.ledger.admit(&request).await {
        Ok(outcome) => outcome,
        Err(error) => {
            for part in &plan.parts {
                part.limiter
                    .policy
                    .on_store_error(part.limiter.layer, &error)?;
            }
            if pending.is_some() {
                config.policy.on_store_error("CreditGuard", &error)?;
            }
            // Admitted unchecked: the cost is still recorded at the end
            // (the hold, when no usage arrives) once the store is back.
            let additions = plan
                .parts
                .iter()
                .map(|part| (part.finish)(Verdict::Unchecked))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(admitted(
                pending.take(),
                charge,
                None,
                credential,
                additions,
            ));
        }
    };
    if !outcome.admitted {
        // Refused: nothing was counted or held.
        pending.take();
    }
    // Before the parts' verdicts: a revoked or expired key is refused as
    // such, not as over a rate it would also have passed.
    match outcome.hold {
        Some(ReserveOutcome::KeyRevoked) => {
            return Err(crate::auth::leaked_key(auth_words.as_deref(), None));
        }
        Some(ReserveOutcome::KeyExpired { expired_at }) => {
            return Err(crate::auth::past_expiry(
                auth_words.as_deref(),
                expired_at,
                charge_rotated,
            ));
        }
        _ => {}
    }
    let mut additions = Vec::with_capacity(plan.parts.len());
    for (part, range) in plan.parts.iter().zip(ranges) {
        let verdict = part.limiter.judge(
            &request.account,
            &part.checks,
            part.tier.map(|tier| tier.check_index),
            outcome.admitted,
            outcome.checks[range].to_vec(),
            part.limiter.now(),
        );
        additions.push((part.finish)(verdict)?);
    }
    match (outcome.hold, charge) {
        (Some(ReserveOutcome::Reserved { held_nanos, .. }), Some(charge)) => {
            // Granted: renewed from now on, until its settlement is recorded.
            let meter = pending.take().map(|meter| Meter {
                hold_granted: true,
                // Only an admitted request is a call to a model.
                span: chat_span(&charge),
                renewal: Some(Arc::new(config.renewals.track(
                    &meter.account,
                    &meter.key,
                    &meter.reservation_id,
                ))),
                ..meter
            });
            Ok(admitted(
                meter,
                Some(charge),
                Some(held_nanos),
                credential,
                additions,
            ))
        }
        (Some(refusal), Some(charge)) => Err(refused(&charge, refusal)),
        (_, charge) if outcome.admitted => Ok(admitted(None, charge, None, credential, additions)),
        _ => Err(GatewayError::new(
            ErrorKind::Internal,
            "the store refused the request without saying which limit; retry",
        )),
    }
}

/// The span of a call to a model, in OpenTelemetry's GenAI semantic
/// conventions (`gen_ai.*`; a tracing backend shows it as a model call,
/// named `chat <model>`, of client kind), a child of the current span. Its
/// usage is recorded when the request settles, and it ends then. Its
/// target is [`GEN_AI_SPAN_TARGET`], for subscribers to keep it or not.
fn chat_span(charge: &Charge) -> tracing::Span {
    let span = tracing::info_span!(
        target: GEN_AI_SPAN_TARGET,
        "chat",
        otel.name = %ChatSpanName(&charge.model),
        otel.kind = "client",
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = &*charge.provider,
        gen_ai.request.model = &*charge.model,
        // What the client reads: the gateway names the served model in
        // every answer.
        gen_ai.response.model = &*charge.model,
        gen_ai.request.max_tokens = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
    );
    if let Some(max_tokens) = charge.client_bound_tokens {
        span.record("gen_ai.request.max_tokens", max_tokens);
    }
    span
}

/// The target of CreditGuard's `chat` spans (see [`CreditGuard`]): a log
/// that wants only its own lines filters it out; an OpenTelemetry exporter
/// keeps it.
pub const GEN_AI_SPAN_TARGET: &str = "modelgate::gen_ai";

/// `chat <model>`, written when a subscriber reads it.
struct ChatSpanName<'a>(&'a str);

impl std::fmt::Display for ChatSpanName<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "chat {}", self.0)
    }
}

/// The hold a chat request asks for, and its meter: the prompt and the
/// client's bound, or else as much of the default bound as the key's limit
/// and the balance pay for, at least one completion token. The meter takes
/// the charge's generation context: the record is the meter's to write.
fn hold_request(
    config: &CreditGuardConfig,
    account: &str,
    charge: &mut Charge,
    byok: bool,
) -> (ReserveRequest, Meter) {
    let charged_key = charge.key;
    // BYOK usage that does not count against the key's limit neither
    // holds nor is checked against it.
    let counted = charge.counted(byok);
    let bound_tokens = charge
        .client_bound_tokens
        .unwrap_or(charge.default_bound_tokens);
    let estimate_nanos = charge.cost_nanos(bound_tokens);
    let flexible = charge.client_bound_tokens.is_none() && !charge.free;
    let amount_nanos = if counted && !charge.free {
        estimate_nanos
    } else {
        0
    };
    let reservation = ReserveRequest {
        account: account.to_owned(),
        key: charged_key.hash.to_hex(),
        reservation_id: new_reservation_id(config.clock.now()),
        amount_nanos,
        min_amount_nanos: (flexible && amount_nanos > 0)
            .then(|| charge.cost_nanos(charge.min_bound_tokens)),
        key_limit: charged_key.limit.filter(|_| counted),
        counts_against_key_limit: counted,
        check_balance: true,
        covered_by_balance: !byok && !charge.free,
        ttl: config.renewals.hold_ttl(),
        lapse_record: config
            .generations
            .as_ref()
            .map(|generations| RecordKeeping {
                retention: generations.retention,
                max_per_account: generations.max_per_account,
                // The model asked for: a lapse counts under it.
                model: is_lapse_model(&charge.model).then(|| charge.model.to_string()),
            }),
    };
    let meter = Meter {
        ledger: config.ledger.clone(),
        account: reservation.account.clone(),
        key: reservation.key.clone(),
        reservation_id: reservation.reservation_id.clone(),
        // Until the store answers that it holds it.
        hold_granted: false,
        estimate_nanos,
        price: Arc::clone(&charge.price),
        api: charge.api,
        free: charge.free,
        byok,
        response_success: None,
        late: false,
        prompt_tokens: charge.likely_prompt_tokens,
        streamed_tokens: None,
        pending: config.pending.clone(),
        renewal: None,
        span: tracing::Span::none(),
        generation: charge.generation.take(),
        key_limit: charged_key.limit,
        on_settled: config.on_settled.clone(),
    };
    (reservation, meter)
}

/// The admitted request's additions, with the body edits its hold implies:
/// the completion bound in the provider's field (the client's, or when the
/// client set none what `held_nanos` pays for, up to the default), and a
/// stream's usage asked for.
fn admitted(
    meter: Option<Meter>,
    charge: Option<Box<Charge>>,
    held_nanos: Option<i64>,
    credential: Option<ByokCredential>,
    additions: Vec<Admission>,
) -> Admitted {
    let Some(charge) = charge else {
        return Admitted {
            meter,
            credential,
            additions,
            body_edits: None,
            hide_stream_usage: false,
            sent: None,
        };
    };
    // Written whether or not the client set one: in the field the
    // provider reads, which may not be the one the client used.
    let write_bound = Some(match charge.client_bound_tokens {
        Some(client_bound_tokens) => client_bound_tokens,
        None => match held_nanos {
            // What the hold pays for, up to the default; the store held at
            // least the prompt and one token.
            Some(held_nanos) if held_nanos > 0 => charge
                .affordable_tokens(held_nanos, charge.default_bound_tokens)
                .max(charge.min_bound_tokens),
            _ => charge.default_bound_tokens,
        },
    });
    let mut meter = meter;
    if let Some(meter) = &mut meter {
        // A request that ends without usage is charged what it could cost.
        meter.estimate_nanos = charge.cost_nanos(
            write_bound
                .or(charge.client_bound_tokens)
                .unwrap_or(charge.default_bound_tokens),
        );
    }
    Admitted {
        meter,
        credential,
        additions,
        body_edits: Some(BodyEdits {
            write_bound: write_bound
                .zip(charge.bound_field)
                .map(|(tokens, field)| (field, tokens)),
            ask_stream_usage: charge.ask_stream_usage,
            max_tool_calls: charge.max_tool_calls,
            stateless: charge.stateless,
        }),
        hide_stream_usage: charge.ask_stream_usage,
        sent: None,
    }
}

/// The 402 of a hold the store refused, saying what was asked for and
/// what is left.
fn refused(charge: &Charge, refusal: ReserveOutcome) -> GatewayError {
    let asked_tokens = charge
        .client_bound_tokens
        .unwrap_or(charge.default_bound_tokens);
    // What the room left pays for, in completion tokens per choice.
    let tokens_for = |room_nanos: i64| charge.affordable_tokens(room_nanos, asked_tokens);
    let asked = match (charge.client_bound_tokens, charge.bound_field) {
        (Some(_), None) => format!(
            "this request's input could cost {} credits",
            decimal_string(charge.cost_nanos(0), 0)
        ),
        (Some(tokens), Some(field)) => format!(
            "this request asks for up to {tokens} completion tokens ({}), which with its prompt could cost {} credits",
            field.name(),
            decimal_string(charge.cost_nanos(tokens), 0)
        ),
        (None, _) if charge.min_bound_tokens > 1 => format!(
            "this request's prompt and {} completion tokens (one more than its thinking budget) could cost {} credits",
            charge.min_bound_tokens,
            decimal_string(charge.cost_nanos(charge.min_bound_tokens), 0)
        ),
        (None, _) => format!(
            "this request's prompt and one completion token could cost {} credits",
            decimal_string(charge.cost_nanos(1), 0)
        ),
    };
    match refusal {
        ReserveOutcome::KeyLimitReached {
            used_nanos,
            limit_nanos,
            resets_at,
        } => {
            let room_nanos = limit_nanos.saturating_sub(used_nanos);
            let affordable = tokens_for(room_nanos);
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
                    "this key's credit limit is {} credits and {} are used or held by requests in flight; {asked}, and what is left pays for {affordable} completion tokens; {when}. Raise the key's limit, lower max_tokens, or use another key",
                    decimal_string(limit_nanos, 0),
                    decimal_string(used_nanos, 0),
                ),
            )
            .with_metadata("limit", nanos_to_json(limit_nanos))
            .with_metadata("used", nanos_to_json(used_nanos))
            .with_metadata("affordable_tokens", affordable);
            if charge.client_bound_tokens.is_some() {
                error = error.with_metadata("requested_tokens", asked_tokens);
            }
            if let Some(resets_at) = resets_at {
                error = error.with_metadata(
                    "resets_at",
                    resets_at.to_rfc3339_opts(SecondsFormat::Secs, true),
                );
            }
            error
        }
        ReserveOutcome::BalanceNegative { balance_nanos } => GatewayError::insufficient_credits(
            LimitSource::Credits,
            format!(
                "the account balance is negative ({} credits); top up the account to continue. This applies to free models too",
                decimal_string(balance_nanos, 2)
            ),
        )
        .with_metadata("balance", nanos_to_json(balance_nanos)),
        ReserveOutcome::BalanceInsufficient {
            balance_nanos,
            held_nanos,
        } => {
            let affordable = tokens_for(balance_nanos.saturating_sub(held_nanos));
            let message = if balance_nanos == 0 && held_nanos == 0 {
                format!(
                    "the account has no credits; paid models need credits (free models, whose ids end in :free, do not). {asked}. Top up the account"
                )
            } else {
                format!(
                    "the account balance is {} credits, of which {} are held by requests in flight; {asked}, and what is left pays for {affordable} completion tokens. Top up the account, lower max_tokens, or wait for requests in flight to finish",
                    decimal_string(balance_nanos, 2),
                    decimal_string(held_nanos, 2),
                )
            };
            let mut error = GatewayError::insufficient_credits(LimitSource::Credits, message)
                .with_metadata("balance", nanos_to_json(balance_nanos))
                .with_metadata("held", nanos_to_json(held_nanos))
                .with_metadata("affordable_tokens", affordable);
            if charge.client_bound_tokens.is_some() {
                error = error.with_metadata("requested_tokens", asked_tokens);
            }
            error
        }
        // Revoked after this instance cached the key: the same 401 BearerAuth
        // gives once its cache catches up.
        ReserveOutcome::KeyRevoked => crate::auth::leaked_key(charge.auth_words.as_deref(), None),
        // Expired by the store's clock before this instance's noticed.
        ReserveOutcome::KeyExpired { expired_at } => crate::auth::past_expiry(
            charge.auth_words.as_deref(),
            expired_at,
            charge.key.rotated,
        ),
        ReserveOutcome::Reserved { .. } => GatewayError::new(
            ErrorKind::Internal,
            "a granted hold was read as a refusal; retry",
        ),
    }
}

/// 32 hex digits: the milliseconds since 1970 at `now` (12), then 80
/// random bits (20). Ids made later sort later, so a store that indexes
/// them (SQLite's B-trees) adds and removes them at one end instead of in
/// a page anywhere: a request writes far fewer pages.
fn new_reservation_id(now: DateTime<Utc>) -> String {
    let millis = u128::try_from(now.timestamp_millis()).unwrap_or(0);
    let random = crate::random::u128() & ((1 << 80) - 1);
    // 12 hex digits of milliseconds, then 20 of randomness.
    let id = ((millis & ((1 << 48) - 1)) << 80) | random;
    let mut digits = [0; 32];
    hex::encode_to_slice(id.to_be_bytes(), &mut digits).expect("32 digits for 16 bytes");
    String::from_utf8(digits.to_vec()).expect("hex digits are ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credit::{PriceOverride, TokenRates};
    use chrono::TimeZone;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    #[test]
    fn reservation_ids_are_32_hex_digits_and_later_ones_sort_later() {
        let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
        let first = new_reservation_id(now);
        let second = new_reservation_id(now + chrono::Duration::milliseconds(1));
        for id in [&first, &second] {
            assert_eq!(id.len(), 32);
            assert!(id.bytes().all(|byte| byte.is_ascii_hexdigit()));
        }
        assert!(first < second, "{first} then {second}");
        // The random part keeps ids of one millisecond apart.
        let ids: std::collections::HashSet<String> =
            (0..1000).map(|_| new_reservation_id(now)).collect();
        assert_eq!(ids.len(), 1000);
    }

    /// One nano per token, both ways.
    const NANO_A_TOKEN: TokenPrice = TokenPrice::per_million_tokens(1_000_000, 1_000_000);

    fn parse(body: &Value) -> ChatRequest {
        ChatRequest::parse(body.to_string().as_bytes()).unwrap()
    }

    fn estimate_with(body: &Value, bounds: PromptBounds) -> i64 {
        estimate_max_cost_nanos(&parse(body), &NANO_A_TOKEN, &bounds, 100).unwrap()
    }

    fn estimate(body: &Value) -> i64 {
        estimate_with(body, PromptBounds::default())
    }

    /// The overhead of `messages` messages and the reply's header.
    fn overhead(messages: u64) -> i64 {
        ((messages + 1) * MESSAGE_OVERHEAD_TOKENS) as i64
    }

    fn user(content: Value) -> Value {
        json!({"model": "a/b", "max_tokens": 10, "messages": [{"role": "user", "content": content}]})
    }

    #[test]
    fn text_counts_a_token_per_byte_whatever_the_script() {
        // 9 ASCII bytes, one message, 100 default completion tokens.
        let ascii = json!({"model": "a/b", "messages": [{"role": "user", "content": "123456789"}]});
        assert_eq!(estimate(&ascii), 9 + overhead(1) + 100);
        // 3 CJK characters are 9 bytes, 4 Cyrillic ones 8: a token a byte,
        // which no tokenizer exceeds.
        let cjk = json!({"model": "a/b", "messages": [{"role": "user", "content": "你好吗"}]});
        assert_eq!(estimate(&cjk), 9 + overhead(1) + 100);
        let cyrillic = json!({"model": "a/b", "messages": [
            {"role": "system", "content": "Да"}, {"role": "user", "content": "да"}]});
        assert_eq!(estimate(&cyrillic), 8 + overhead(2) + 100);
        // Text parts and refusals count their text.
        let parts =
            user(json!([{"type": "text", "text": "é"}, {"type": "refusal", "refusal": "no"}]));
        assert_eq!(estimate(&parts), 4 + overhead(1) + 10);
    }

    #[test]
    fn everything_else_the_upstream_reads_counts_by_its_json_size() {
        // Tool calls in a message's other fields count too.
        let calls = json!({"tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
        let tool = json!({"model": "a/b", "max_tokens": 1, "messages": [
            {"role": "assistant", "content": "", "tool_calls": calls["tool_calls"]}]});
        assert_eq!(
            estimate(&tool),
            calls.to_string().len() as i64 + overhead(1) + 1
        );
        // A response format and other top-level fields count too.
        let schema = json!({"model": "a/b", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"description": "d".repeat(3000)}}}});
        assert!(
            estimate(&schema) > 3000 + overhead(1),
            "{}",
            estimate(&schema)
        );
        let legacy = json!({"model": "a/b", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
            "functions": [{"name": "f", "description": "d".repeat(3000)}]});
        assert!(
            estimate(&legacy) > 3000 + overhead(1),
            "{}",
            estimate(&legacy)
        );
        // A text part whose text is not a string: its whole JSON.
        let odd = user(json!([{"type": "text", "text": {"nested": "abc"}}]));
        let part_bytes = json!({"type": "text", "text": {"nested": "abc"}})
            .to_string()
            .len() as i64;
        assert_eq!(estimate(&odd), part_bytes + overhead(1) + 10);
    }

    #[test]
    fn parts_that_are_not_text_count_their_models_bound() {
        let image = json!({"type": "image_url", "image_url": {"url": "https://x/y.png"}});
        let file = json!({"type": "file", "file": {"file_data": "A".repeat(30_000)}});
        let audio =
            json!({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}});
        let video = json!({"type": "video_url", "video_url": {"url": "https://x/y.mp4"}});
        let per_part = PromptBounds {
            context_length_tokens: Some(100_000),
            max_tokens_per_image: Some(700),
            max_tokens_per_file: Some(5000),
        };
        let context_only = PromptBounds {
            context_length_tokens: Some(20_000),
            ..PromptBounds::default()
        };
        // max_tokens × n completions besides.
        let mut body = user(json!([{"type": "text", "text": "abc"}, image]));
        body["n"] = json!(2);
        assert_eq!(estimate_with(&body, per_part), 3 + overhead(1) + 700 + 20);
        assert_eq!(
            estimate_with(&body, context_only),
            20_000 + 20,
            "the context length, and the prompt never counts past it"
        );
        // A file counts its bound, not its size; audio is a file.
        for part in [&file, &audio] {
            assert_eq!(
                estimate_with(&user(json!([part])), per_part),
                overhead(1) + 5000 + 10
            );
        }
        // A kind of part the gateway does not know: the context length.
        assert_eq!(
            estimate_with(
                &user(json!([video, {"type": "text", "text": "x"}])),
                per_part
            ),
            100_000 + 10,
            "capped at the context length"
        );
        // Two images under a large context.
        let wide = PromptBounds {
            context_length_tokens: Some(1_000_000),
            ..per_part
        };
        assert_eq!(
            estimate_with(&user(json!([image, image])), wide),
            overhead(1) + 1400 + 10
        );
    }

    #[test]
    fn an_unbounded_part_is_counted_at_its_size_and_refused_only_if_the_prompt_holds_credits() {
        let image = json!({"type": "image_url", "image_url": {"url": "https://x/y.png"}});
        let chat = parse(&user(json!([{"type": "text", "text": "abc"}, image])));
        let count = count_prompt(&chat, &PromptBounds::default());
        let image_bytes = image.to_string().len() as u64;
        assert_eq!(count.tokens, 3 + image_bytes + 2 * MESSAGE_OVERHEAD_TOKENS);
        // Charged without usage: its bytes as a stream's text is counted.
        assert_eq!(
            count.likely_tokens,
            (3 + image_bytes).div_ceil(3) + 2 * LIKELY_MESSAGE_OVERHEAD_TOKENS
        );
        assert_eq!(
            count.unbounded,
            estimate_prompt_tokens(&chat, &PromptBounds::default()).err()
        );
        let charge = |price: TokenPrice, free: bool, include_byok_in_limit: bool| Charge {
            auth_words: None,
            key: ChargedKey::of(&Principal {
                include_byok_in_limit,
                ..Principal::for_tests("a")
            }),
            generation: None,
            provider: Arc::from("a"),
            model: Arc::from("a/b"),
            api: ModelApi::Chat,
            prompt_tokens: count.tokens,
            likely_prompt_tokens: count.likely_tokens,
            unbounded_prompt: count.unbounded.clone(),
            client_bound_tokens: Some(10),
            min_bound_tokens: 1,
            fixed_nanos: 0,
            choices: 1,
            ask_stream_usage: false,
            bound_field: Some(BoundField::default()),
            max_tool_calls: None,
            stateless: false,
            default_bound_tokens: 100,
            price: Arc::new(price),
            free,
        };
        let prompt_free = TokenPrice::per_million_tokens(0, 1_000_000);
        // Free prompts, but a dearer completion past a prompt size: the
        // prompt's size decides the charge, so it must be bounded.
        let mut tiered = prompt_free;
        tiered.overrides[0] = Some(PriceOverride {
            min_prompt_tokens: 100_000,
            rates: TokenRates {
                completion_nanos_per_million_tokens: 10_000_000,
                ..prompt_free.rates
            },
        });
        // (price, free model, include_byok_in_limit, byok) → holds the prompt.
        for (price, free, include, byok, holds) in [
            (NANO_A_TOKEN, false, false, false, true),
            (NANO_A_TOKEN, false, true, true, true),
            (NANO_A_TOKEN, false, false, true, false),
            (TokenPrice::FREE, true, false, false, false),
            (prompt_free, false, false, false, false),
            (prompt_free, false, true, true, false),
            (tiered, false, false, false, true),
        ] {
            assert_eq!(
                charge(price, free, include).holds_prompt(byok),
                holds,
                "{price:?} free {free} include {include} byok {byok}"
            );
        }
    }

    #[test]
    fn a_part_without_a_bound_is_refused_naming_the_field_to_set() {
        let cases = [
            (
                json!({"type": "image_url", "image_url": {"url": "https://x/y.png"}}),
                "max_tokens_per_image",
            ),
            (
                json!({"type": "file", "file": {"file_id": "f1"}}),
                "max_tokens_per_file",
            ),
            (
                json!({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "mp3"}}),
                "max_tokens_per_file",
            ),
            (
                json!({"type": "video_url", "video_url": {"url": "https://x/y.mp4"}}),
                "context_length",
            ),
        ];
        for (part, field) in cases {
            let chat = parse(&user(json!([{"type": "text", "text": "see"}, part])));
            let error = estimate_prompt_tokens(&chat, &PromptBounds::default()).unwrap_err();
            assert_eq!(error.status(), 400);
            assert_eq!(error.metadata()["param"], field);
            assert_eq!(error.metadata()["reason"], "unbounded_prompt_part");
            assert!(
                error.message().contains(field)
                    && error.message().contains("messages[0].content[1]"),
                "{}",
                error.message()
            );
            // Only the bound named is missing: set it and the part counts.
            let bounds = match field {
                "max_tokens_per_image" => PromptBounds {
                    max_tokens_per_image: Some(9),
                    ..PromptBounds::default()
                },
                "max_tokens_per_file" => PromptBounds {
                    max_tokens_per_file: Some(9),
                    ..PromptBounds::default()
                },
                _ => PromptBounds {
                    context_length_tokens: Some(9_999),
                    ..PromptBounds::default()
                },
            };
            assert!(estimate_prompt_tokens(&chat, &bounds).is_ok(), "{field}");
        }
    }

    /// A request of `texts`, each a message of plain text or (when its
    /// flag is set) a text part.
    fn conversation(texts: &[(String, bool)], image: bool) -> Value {
        let mut messages: Vec<Value> = texts
            .iter()
            .map(|(text, as_part)| {
                let content = if *as_part {
                    json!([{"type": "text", "text": text}])
                } else {
                    json!(text)
                };
                json!({"role": "user", "content": content})
            })
            .collect();
        if image {
            messages.push(json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}));
        }
        json!({"model": "a/b", "messages": messages})
    }

    fn bounds_from(context: Option<u64>) -> PromptBounds {
        PromptBounds {
            context_length_tokens: context,
            max_tokens_per_image: Some(765),
            max_tokens_per_file: None,
        }
    }

    proptest! {
        #[test]
        fn the_estimate_is_never_below_the_texts_utf8_bytes(
            texts in prop::collection::vec(("\\PC{0,40}", any::<bool>()), 1..6),
            image in any::<bool>(),
            context in prop::option::of(1u64..400),
        ) {
            let bounds = bounds_from(context);
            let tokens = estimate_prompt_tokens(&parse(&conversation(&texts, image)), &bounds).unwrap();
            let bytes: u64 = texts.iter().map(|(text, _)| text.len() as u64).sum();
            let floor = bytes + u64::from(image) * 765;
            prop_assert!(tokens >= context.map_or(floor, |context| floor.min(context)), "{tokens} < {floor}");
            if let Some(context) = context {
                prop_assert!(tokens <= context);
            }
            // What is charged without usage never passes what was held.
            let count = count_prompt(&parse(&conversation(&texts, image)), &bounds);
            prop_assert!(count.likely_tokens <= count.tokens);
            prop_assert!(count.likely_tokens >= bytes.div_ceil(3).min(count.tokens));
        }

        #[test]
        fn the_estimate_grows_with_content(
            texts in prop::collection::vec(("\\PC{0,40}", any::<bool>()), 1..6),
            more in "\\PC{0,40}",
            which in any::<prop::sample::Index>(),
            image in any::<bool>(),
            context in prop::option::of(1u64..400),
        ) {
            let bounds = bounds_from(context);
            let tokens = |texts: &[(String, bool)], image: bool| {
                estimate_prompt_tokens(&parse(&conversation(texts, image)), &bounds).unwrap()
            };
            let before = tokens(&texts, image);
            // More text in a message, another message, an image.
            let mut longer = texts.clone();
            longer[which.index(texts.len())].0.push_str(&more);
            prop_assert!(tokens(&longer, image) >= before);
            let mut added = texts.clone();
            added.push((more.clone(), false));
            prop_assert!(tokens(&added, image) >= before);
            prop_assert!(tokens(&texts, true) >= before);
        }
    }
}
