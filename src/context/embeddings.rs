//! OpenAI's embeddings request (`POST /v1/embeddings`): parsed once,
//! validated, and bounded for a hold.
//!
//! Bad input is refused as the chat and Responses parsers refuse it: 400
//! `invalid_request_error` for what is missing, empty or an unknown value
//! (and more than [`MAX_EMBEDDING_INPUTS`] inputs), 422 `invalid_parameter`
//! for a wrong type or a number out of range, each naming the field's path
//! (`input[3][0]`) in its message and in `metadata.param`. Other fields are
//! kept as sent.
//!
//! An embedding generates no tokens: its cost is its input's, bounded by
//! [`EmbeddingsRequest::prompt_bound_tokens`].
//!
//! ```
//! use modelgate::body::{EmbeddingsInput, EmbeddingsRequest, EMBEDDING_INPUT_OVERHEAD_TOKENS};
//!
//! let request = EmbeddingsRequest::parse(br#"{"model": "openai/text-embedding-3-small",
//!     "input": ["The food was delicious", "and the waiter..."], "dimensions": 256}"#).unwrap();
//! assert_eq!(request.dimensions, Some(256));
//! assert!(matches!(&request.input, EmbeddingsInput::Texts(texts) if texts.len() == 2));
//! assert_eq!(request.prompt_bound_tokens(), 22 + 17 + 2 * EMBEDDING_INPUT_OVERHEAD_TOKENS);
//!
//! // Tokens, each list non-empty.
//! let error = EmbeddingsRequest::parse(br#"{"model": "a/b", "input": [[1, 2], []]}"#).unwrap_err();
//! assert_eq!(error.status(), 400);
//! assert_eq!(error.metadata()["param"], "input[1]");
//! ```

use serde_json::{Map, Value};

use crate::error::GatewayError;
use crate::json_input::{
    At, bad_request, integer_at_least, request_body_fields, take_model, take_optional_string,
};
use crate::model_id::{ModelId, ModelNames};

/// The most inputs one request may embed, as OpenAI takes.
pub const MAX_EMBEDDING_INPUTS: usize = 2048;

/// Tokens counted for each input beside its own: the special tokens a
/// tokenizer puts around a text (a beginning and an end of sequence, or
/// BERT's `[CLS]` and `[SEP]`: two in every tokenizer we know), with room
/// to spare. A prefix an upstream adds on its own (an instruction
/// template) is not in the request and not bounded here.
pub const EMBEDDING_INPUT_OVERHEAD_TOKENS: u64 = 4;

/// A parsed and validated embeddings request.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingsRequest {
    /// The model id, as the body names it (a bare id or an alias as the
    /// client sent it).
    pub model: String,
    /// The model the gateway chose: `model` parsed, or what the
    /// [`ModelNames`] of `BodyLimit` made of a
    /// bare id or alias. Prices, limits, quotas and records use this one.
    pub model_id: ModelId,
    /// What to embed.
    pub input: EmbeddingsInput,
    /// The embeddings' size asked for; at least 1.
    pub dimensions: Option<u64>,
    /// `encoding_format`: `float` or `base64`.
    pub encoding_format: Option<String>,
    /// The end user's id.
    pub user: Option<String>,
    /// Every other top-level field, kept as sent.
    pub extra: Map<String, Value>,
}

/// The `input` of an embeddings request: one or more texts, or one or more
/// lists of token ids. Never empty, nor any text or list in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EmbeddingsInput {
    /// One text.
    Text(String),
    /// Texts, one embedding each.
    Texts(Vec<String>),
    /// One list of token ids.
    Tokens(Vec<u64>),
    /// Lists of token ids, one embedding each.
    TokenLists(Vec<Vec<u64>>),
}

impl EmbeddingsInput {
    /// How many embeddings the input asks for.
    pub fn count(&self) -> usize {
        match self {
            EmbeddingsInput::Text(_) | EmbeddingsInput::Tokens(_) => 1,
            EmbeddingsInput::Texts(texts) => texts.len(),
            EmbeddingsInput::TokenLists(lists) => lists.len(),
        }
    }
}

impl EmbeddingsRequest {
    /// Parses and validates the body of `POST /v1/embeddings`.
    ///
    /// 400 `invalid_request_error` for a body that is not a JSON object, a
    /// field named twice, a missing or empty `model` or `input`, an empty
    /// text or token list, more than [`MAX_EMBEDDING_INPUTS`] inputs, or an
    /// unknown `encoding_format`; 422 `invalid_parameter` for a field of
    /// the wrong type (a list mixing texts and tokens included) or out of
    /// range (a token id that is not a whole number, `dimensions` below 1).
    pub fn parse(body: &[u8]) -> Result<EmbeddingsRequest, GatewayError> {
        Self::parse_named(body, &ModelNames::new())
    }

    /// As [`EmbeddingsRequest::parse`], a bare id or alias resolved by `names`.
    pub(crate) fn parse_named(
        body: &[u8],
        names: &ModelNames,
    ) -> Result<EmbeddingsRequest, GatewayError> {
        let mut fields = request_body_fields(body)?;
        let model = take_model(&mut fields)?;
        let input = parse_input(fields.remove("input"))?;
        let dimensions = integer_at_least(fields.remove("dimensions").as_ref(), "dimensions", 1)?;
        let format_at = At::Top("encoding_format");
        let encoding_format = match fields.remove("encoding_format") {
            None | Some(Value::Null) => None,
            Some(Value::String(format)) if format == "float" || format == "base64" => Some(format),
            Some(Value::String(format)) => {
                return Err(format_at.unknown(&format, "float or base64"));
            }
            Some(other) => return Err(format_at.wrong_type("a string", &other)),
        };
        let user = take_optional_string(&mut fields, &At::Root, "user")?;
        let model_id = names.resolve(&model)?;
        Ok(EmbeddingsRequest {
            model,
            model_id,
            input,
            dimensions,
            encoding_format,
            user,
            extra: fields,
        })
    }

    /// The most tokens the input can count, whatever the upstream's
    /// tokenizer: a text's bytes (no tokenizer makes more tokens than
    /// bytes), a token list's length, and each input
    /// [`EMBEDDING_INPUT_OVERHEAD_TOKENS`] more.
    pub fn prompt_bound_tokens(&self) -> u64 {
        let own: u64 = match &self.input {
            EmbeddingsInput::Text(text) => text.len() as u64,
            EmbeddingsInput::Texts(texts) => texts.iter().map(|text| text.len() as u64).sum(),
            EmbeddingsInput::Tokens(tokens) => tokens.len() as u64,
            EmbeddingsInput::TokenLists(lists) => lists.iter().map(|list| list.len() as u64).sum(),
        };
        let count = self.input.count() as u64;
        own.saturating_add(count.saturating_mul(EMBEDDING_INPUT_OVERHEAD_TOKENS))
    }
}

fn parse_input(value: Option<Value>) -> Result<EmbeddingsInput, GatewayError> {
    let at = At::Top("input");
    let values = match value {
        None | Some(Value::Null) => {
            return Err(at.missing(
                "a string, an array of strings, an array of token ids or an array of such arrays",
            ));
        }
        Some(Value::String(text)) => return Ok(EmbeddingsInput::Text(non_empty_text(&at, text)?)),
        Some(Value::Array(values)) => values,
        Some(other) => {
            return Err(at.wrong_type("a string or an array", &other));
        }
    };
    if values.is_empty() {
        return Err(bad_request("input", "`input` must not be empty"));
    }
    if values.len() > MAX_EMBEDDING_INPUTS {
        return Err(bad_request(
            "input",
            format!(
                "`input` holds {} inputs; a request may embed at most {MAX_EMBEDDING_INPUTS}: split it",
                values.len()
            ),
        ));
    }
    // The first element says what the array is; every other must be alike.
    match &values[0] {
        Value::String(_) => values
            .into_iter()
            .enumerate()
            .map(|(index, value)| match value {
                Value::String(text) => non_empty_text(&at.index(index), text),
                other => Err(at
                    .index(index)
                    .wrong_type("a string, as the first input is", &other)),
            })
            .collect::<Result<_, _>>()
            .map(EmbeddingsInput::Texts),
        Value::Number(_) => token_list(&at, values).map(EmbeddingsInput::Tokens),
        Value::Array(_) => values
            .into_iter()
            .enumerate()
            .map(|(index, value)| {
                let at = at.index(index);
                match value {
                    Value::Array(tokens) if tokens.is_empty() => Err(bad_request(
                        &at.param(),
                        format!("`{at}` must hold at least one token"),
                    )),
                    Value::Array(tokens) => token_list(&at, tokens),
                    other => {
                        Err(at.wrong_type("an array of token ids, as the first input is", &other))
                    }
                }
            })
            .collect::<Result<_, _>>()
            .map(EmbeddingsInput::TokenLists),
        other => Err(at
            .index(0)
            .wrong_type("a string, a token id or an array of token ids", other)),
    }
}

fn non_empty_text(at: &At<'_>, text: String) -> Result<String, GatewayError> {
    if text.is_empty() {
        let param = at.param();
        return Err(bad_request(
            &param,
            format!("`{param}` must not be an empty string"),
        ));
    }
    Ok(text)
}

fn token_list(at: &At<'_>, tokens: Vec<Value>) -> Result<Vec<u64>, GatewayError> {
    tokens
        .iter()
        .enumerate()
        .map(|(index, token)| {
            let at = at.index(index);
            match token {
                Value::Number(_) => {
                    integer_at_least(Some(token), at, 0).map(|id| id.unwrap_or_default())
                }
                other => Err(at.wrong_type("a token id, a whole number", other)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json_input::strategies::any_json;
    use proptest::prelude::*;
    use serde_json::json;

    fn parse(value: &Value) -> Result<EmbeddingsRequest, GatewayError> {
        EmbeddingsRequest::parse(value.to_string().as_bytes())
    }

    fn input(input: Value) -> Value {
        json!({"model": "openai/text-embedding-3-small", "input": input})
    }

    /// The refusal's status, `metadata.param` and message.
    fn refusal(body: &Value) -> (u16, String, String) {
        let error = parse(body).expect_err("refused");
        let param = error.metadata()["param"].as_str().unwrap_or("").to_owned();
        (error.status().as_u16(), param, error.message().to_owned())
    }

    #[test]
    fn each_input_shape_is_read_and_bounded() {
        let overhead = EMBEDDING_INPUT_OVERHEAD_TOKENS;
        let request = parse(&input(json!("héllo"))).unwrap();
        assert_eq!(request.input, EmbeddingsInput::Text("héllo".into()));
        assert_eq!(request.prompt_bound_tokens(), 6 + overhead);
        let request = parse(&input(json!(["a", "bc"]))).unwrap();
        assert_eq!(request.input.count(), 2);
        assert_eq!(request.prompt_bound_tokens(), 3 + 2 * overhead);
        let request = parse(&input(json!([1, 2, 100_000]))).unwrap();
        assert_eq!(request.input, EmbeddingsInput::Tokens(vec![1, 2, 100_000]));
        assert_eq!(request.prompt_bound_tokens(), 3 + overhead);
        let request = parse(&input(json!([[1], [2, 3]]))).unwrap();
        assert_eq!(
            request.input,
            EmbeddingsInput::TokenLists(vec![vec![1], vec![2, 3]])
        );
        assert_eq!(request.prompt_bound_tokens(), 3 + 2 * overhead);
        let most: Vec<&str> = vec!["x"; MAX_EMBEDDING_INPUTS];
        let request = parse(&input(json!(most))).unwrap();
        assert_eq!(request.input.count(), MAX_EMBEDDING_INPUTS);
    }

    #[test]
    fn the_other_fields_are_read_and_kept() {
        let request = parse(&json!({"model": "a/b", "input": "x", "dimensions": 1,
            "encoding_format": "base64", "user": "u", "input_type": "query"}))
        .unwrap();
        assert_eq!(request.dimensions, Some(1));
        assert_eq!(request.encoding_format.as_deref(), Some("base64"));
        assert_eq!(request.user.as_deref(), Some("u"));
        assert_eq!(request.extra["input_type"], "query");
        for field in ["dimensions", "encoding_format", "user"] {
            let mut body = input(json!("x"));
            body[field] = Value::Null;
            assert!(parse(&body).is_ok(), "{field}: null");
        }
    }

    #[test]
    fn what_is_missing_empty_too_many_or_unknown_is_a_400_naming_it() {
        let too_many: Vec<&str> = vec!["x"; MAX_EMBEDDING_INPUTS + 1];
        let cases: Vec<(Value, &str, &str)> = vec![
            (json!({"input": "x"}), "model", "is required"),
            (json!({"model": "a/b"}), "input", "is required"),
            (input(json!(null)), "input", "is required"),
            (input(json!("")), "input", "empty string"),
            (input(json!([])), "input", "must not be empty"),
            (input(json!(["a", ""])), "input[1]", "empty string"),
            (input(json!([[1], []])), "input[1]", "at least one token"),
            (input(json!(too_many)), "input", "at most 2048"),
            (
                json!({"model": "a/b", "input": "x", "encoding_format": "int8"}),
                "encoding_format",
                "float or base64",
            ),
        ];
        for (body, param, words) in cases {
            let (status, got_param, message) = refusal(&body);
            assert_eq!(status, 400, "{param}: {message}");
            assert_eq!(got_param, param, "{message}");
            assert!(message.contains(words), "{param}: {message}");
        }
    }

    #[test]
    fn a_wrong_type_or_a_token_out_of_range_is_a_422_naming_it() {
        let cases: Vec<(Value, &str)> = vec![
            (input(json!(5)), "input"),
            (input(json!({"text": "x"})), "input"),
            (input(json!([true])), "input[0]"),
            (input(json!(["a", 1])), "input[1]"),
            (input(json!([1, "a"])), "input[1]"),
            (input(json!([1, -2])), "input[1]"),
            (input(json!([1, 2.5])), "input[1]"),
            (input(json!([[1], 2])), "input[1]"),
            (input(json!([[1], [2, "x"]])), "input[1][1]"),
            (
                json!({"model": "a/b", "input": "x", "dimensions": 0}),
                "dimensions",
            ),
            (
                json!({"model": "a/b", "input": "x", "dimensions": "8"}),
                "dimensions",
            ),
            (
                json!({"model": "a/b", "input": "x", "encoding_format": 1}),
                "encoding_format",
            ),
            (json!({"model": "a/b", "input": "x", "user": 1}), "user"),
        ];
        for (body, param) in cases {
            let (status, got_param, message) = refusal(&body);
            assert_eq!(status, 422, "{param}: {message}");
            assert_eq!(got_param, param, "{message}");
            assert!(message.contains(param), "{message}");
        }
    }

    proptest! {
        #[test]
        fn arbitrary_json_never_panics(value in any_json(&["input", "float"], &["model", "input", "dimensions"])) {
            let _ = parse(&value);
            match parse(&input(value)) {
                Ok(request) => prop_assert!(request.prompt_bound_tokens() >= request.input.count() as u64),
                Err(error) => {
                    prop_assert!(matches!(error.status().as_u16(), 400 | 422));
                    prop_assert!(error.metadata()["param"].is_string());
                }
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = EmbeddingsRequest::parse(&body);
        }

        /// Valid inputs parse to what was sent, bounded by at least their
        /// bytes or tokens.
        #[test]
        fn valid_inputs_parse_to_what_was_sent(
            texts in proptest::collection::vec(".{1,40}", 1..6),
            lists in proptest::collection::vec(proptest::collection::vec(0u64..200_000, 1..8), 1..6),
            dimensions in proptest::option::of(1u64..4096),
        ) {
            let mut body = input(json!(texts));
            if let Some(dimensions) = dimensions { body["dimensions"] = json!(dimensions); }
            let request = parse(&body).unwrap();
            prop_assert_eq!(&request.input, &EmbeddingsInput::Texts(texts.clone()));
            prop_assert_eq!(request.dimensions, dimensions);
            let bytes: usize = texts.iter().map(String::len).sum();
            prop_assert!(request.prompt_bound_tokens() >= bytes as u64);
            let request = parse(&input(json!(lists))).unwrap();
            let tokens: usize = lists.iter().map(Vec::len).sum();
            prop_assert_eq!(&request.input, &EmbeddingsInput::TokenLists(lists.clone()));
            prop_assert_eq!(
                request.prompt_bound_tokens(),
                tokens as u64 + lists.len() as u64 * EMBEDDING_INPUT_OVERHEAD_TOKENS
            );
        }
    }
}
