//! The mock's OpenAI embeddings (`POST {prefix}/embeddings`), as OpenAI
//! answers them: a list of one `embedding` per input, in order, with
//! `usage` (`prompt_tokens`, `total_tokens`).
//!
//! - The vectors are deterministic (the same model and input give the same
//!   vector, in every run) and of unit length; `dimensions` long (8 when
//!   the request sets none); as JSON numbers, or with `encoding_format:
//!   "base64"` as the base64 of their little-endian `f32`s, as OpenAI's.
//! - Tokens are counted as the chat mock counts them: a quarter of each
//!   text's characters (rounded up), and a token list's length.
//! - `…/status-NNN` answers that status; bad input a 400 naming the field.

use http::Response;
use serde_json::{Value, json};

use super::{MockBody, invalid, json_response, status_answer};

/// The vectors' length when the request sets no `dimensions`.
const DEFAULT_DIMENSIONS: u64 = 8;

/// The longest vector the mock makes (OpenAI's largest model's).
const MAX_DIMENSIONS: u64 = 3072;

/// One input to embed: its text (a token list as its numbers) and tokens.
struct Input {
    text: String,
    tokens: u64,
}

/// The request's inputs, or what is wrong with them.
fn inputs(input: &Value) -> Result<Vec<Input>, &'static str> {
    let text = |text: &str| Input {
        text: text.to_owned(),
        tokens: text.len().div_ceil(4) as u64,
    };
    let tokens = |list: &[Value]| -> Result<Input, &'static str> {
        let numbers: Option<Vec<u64>> = list.iter().map(Value::as_u64).collect();
        match numbers {
            Some(numbers) if !numbers.is_empty() => Ok(Input {
                text: format!("{numbers:?}"),
                tokens: numbers.len() as u64,
            }),
            _ => Err("'input' token lists must hold whole numbers and not be empty"),
        }
    };
    match input {
        Value::String(one) if !one.is_empty() => Ok(vec![text(one)]),
        Value::Array(list) if list.is_empty() => Err("'input' must not be empty"),
        Value::Array(list) if list.iter().all(Value::is_number) => Ok(vec![tokens(list)?]),
        Value::Array(list) => list
            .iter()
            .map(|item| match item {
                Value::String(one) if !one.is_empty() => Ok(text(one)),
                Value::Array(list) => tokens(list),
                _ => Err("each of 'input' must be a non-empty string or a token list"),
            })
            .collect(),
        _ => Err("'input' must be a non-empty string, a list of them, or token lists"),
    }
}

/// A stable hash (std's is seeded per process): FNV-1a over the bytes,
/// then splitmix64's finisher, so that its high bits depend on the last
/// bytes too (FNV alone gives near vectors for near texts).
fn stable_hash(bytes: impl IntoIterator<Item = u8>) -> u64 {
    let hash = bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

/// The vector of `text` for `model`: each coordinate from a hash of the
/// three, in [-1, 1), then scaled to unit length.
fn vector(model: &str, text: &str, dimensions: u64) -> Vec<f32> {
    let raw: Vec<f64> = (0..dimensions)
        .map(|index| {
            let hash = stable_hash(
                model
                    .bytes()
                    .chain([0])
                    .chain(text.bytes())
                    .chain(index.to_le_bytes()),
            );
            (hash >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect();
    let length = raw
        .iter()
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt()
        .max(f64::MIN_POSITIVE);
    raw.iter().map(|x| (x / length) as f32).collect()
}

/// Standard base64 with padding (RFC 4648), as OpenAI encodes vectors.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let group = chunk.iter().enumerate().fold(0u32, |group, (at, byte)| {
            group | u32::from(*byte) << (16 - 8 * at)
        });
        for at in 0..4 {
            if at <= chunk.len() {
                out.push(char::from(ALPHABET[(group >> (18 - 6 * at)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The answer to an embeddings request's body.
pub(super) fn answer(body: &[u8]) -> Response<MockBody> {
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return invalid("invalid JSON", "");
    };
    let Some(model) = request["model"].as_str() else {
        return invalid("Missing required parameter: 'model'.", "model");
    };
    if let Some(response) = status_answer(model) {
        return response;
    }
    let inputs = match inputs(&request["input"]) {
        Ok(inputs) => inputs,
        Err(message) => return invalid(message, "input"),
    };
    let dimensions = match &request["dimensions"] {
        Value::Null => DEFAULT_DIMENSIONS,
        value => match value.as_u64() {
            Some(dimensions @ 1..=MAX_DIMENSIONS) => dimensions,
            _ => {
                return invalid(
                    &format!("'dimensions' must be a whole number from 1 to {MAX_DIMENSIONS}"),
                    "dimensions",
                );
            }
        },
    };
    let base64_encoded = match request["encoding_format"].as_str() {
        None if request["encoding_format"].is_null() => false,
        Some("float") => false,
        Some("base64") => true,
        _ => {
            return invalid(
                "'encoding_format' must be 'float' or 'base64'",
                "encoding_format",
            );
        }
    };
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, input)| {
            let vector = vector(model, &input.text, dimensions);
            let embedding = if base64_encoded {
                let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64(&bytes))
            } else {
                json!(vector)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    let tokens: u64 = inputs.iter().map(|input| input.tokens).sum();
    json_response(
        200,
        json!({"object": "list", "data": data, "model": model,
               "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}),
    )
}

#[cfg(test)]
mod tests {
    // No `use super::*`: a bench that includes the mock builds this module
    // without its tests.
    #[test]
    fn base64_pads_as_rfc_4648() {
        assert_eq!(super::base64(b""), "");
        assert_eq!(super::base64(b"f"), "Zg==");
        assert_eq!(super::base64(b"fo"), "Zm8=");
        assert_eq!(super::base64(b"foo"), "Zm9v");
        assert_eq!(super::base64(b"foobar"), "Zm9vYmFy");
    }
}
