//! GitHub's secret-scanning public keys ([`ScanningKeys`]) and the check of
//! an alert's signature ([`ScanningKeys::verify`]).

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::HeaderName;
use p256::ecdsa::signature::Verifier as _;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::DecodePublicKey as _;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::json_input::{JsonBodyError, json_error_reason, json_type, top_level_fields};

/// The header naming the key GitHub signed an alert with.
pub const GITHUB_KEY_IDENTIFIER: HeaderName =
    HeaderName::from_static("github-public-key-identifier");

/// The header carrying the alert's signature: base64 of an ASN.1 DER
/// ECDSA P-256 / SHA-256 signature over the raw body.
pub const GITHUB_KEY_SIGNATURE: HeaderName = HeaderName::from_static("github-public-key-signature");

/// Longest `key_identifier` accepted, in characters (GitHub's are 64 hex
/// digits).
pub const MAX_KEY_IDENTIFIER_CHARS: usize = 256;

/// A DER ECDSA P-256 signature is at most 72 bytes, 96 characters of
/// base64: a longer header is refused before it is decoded.
const MAX_SIGNATURE_BASE64: usize = 96;

/// GitHub's secret-scanning public keys, as published at
/// <https://api.github.com/meta/public_keys/secret_scanning>:
///
/// ```json
/// {"public_keys": [{"key_identifier": "…", "key": "-----BEGIN PUBLIC KEY-----\n…", "is_current": true}]}
/// ```
///
/// Loaded from configuration, never fetched: copy that document into the
/// configuration and renew it when GitHub rotates its keys. Keys that are
/// not current are kept, since GitHub may still sign with them while it
/// rotates. `Debug` lists the identifiers only.
#[derive(Clone)]
pub struct ScanningKeys {
    keys: Vec<ScanningKey>,
}

#[derive(Clone)]
struct ScanningKey {
    identifier: String,
    key: VerifyingKey,
}

/// Why a secret-scanning key document was refused: what is wrong and in
/// which entry of `public_keys` (counted from 0).
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScanningKeysError {
    /// Not JSON: what is wrong and where.
    #[error("the secret-scanning keys are not valid JSON: {0}")]
    NotJson(String),
    /// JSON, but not an object: what it is instead.
    #[error(
        "the secret-scanning keys must be a JSON object with a `public_keys` array, \
         as GitHub publishes them, not {0}"
    )]
    NotAnObject(&'static str),
    /// A top-level field appears twice.
    #[error("the secret-scanning keys have the field `{0}` twice; each field may appear once")]
    DuplicateField(String),
    /// No `public_keys`.
    #[error("the secret-scanning keys have no `public_keys` array")]
    MissingKeys,
    /// `public_keys` is not an array: what it is instead.
    #[error("`public_keys` must be an array, not {0}")]
    KeysNotAnArray(&'static str),
    /// `public_keys` is empty.
    #[error("`public_keys` lists no keys")]
    NoKeys,
    /// An entry is not an object.
    #[error("public_keys[{index}] must be an object with `key_identifier` and `key`, not {found}")]
    EntryNotAnObject {
        /// The entry's place in `public_keys`.
        index: usize,
        /// What it is instead.
        found: &'static str,
    },
    /// An entry has a field twice.
    #[error("public_keys[{index}] has the field `{field}` twice; each field may appear once")]
    EntryDuplicateField {
        /// The entry's place in `public_keys`.
        index: usize,
        /// The field.
        field: String,
    },
    /// An entry lacks `key_identifier` or `key`.
    #[error("public_keys[{index}]: `{field}` is required")]
    MissingField {
        /// The entry's place in `public_keys`.
        index: usize,
        /// `key_identifier` or `key`.
        field: &'static str,
    },
    /// An entry's field has the wrong JSON type.
    #[error("public_keys[{index}]: `{field}` must be {expected}, not {found}")]
    WrongType {
        /// The entry's place in `public_keys`.
        index: usize,
        /// `key_identifier`, `key` or `is_current`.
        field: &'static str,
        /// `a string` or `a boolean`.
        expected: &'static str,
        /// What it is instead.
        found: &'static str,
    },
    /// The identifier is empty, too long or not visible ASCII.
    #[error(
        "public_keys[{index}]: `key_identifier` must be 1 to {MAX_KEY_IDENTIFIER_CHARS} \
         visible ASCII characters"
    )]
    BadIdentifier {
        /// The entry's place in `public_keys`.
        index: usize,
    },
    /// The key is not a P-256 public key in SPKI PEM form.
    #[error(
        "public_keys[{index}] (`{identifier}`): `key` is not a P-256 public key in PEM form \
         (-----BEGIN PUBLIC KEY-----): {reason}"
    )]
    BadKey {
        /// The entry's place in `public_keys`.
        index: usize,
        /// The entry's identifier.
        identifier: String,
        /// What the PEM, DER or curve check said.
        reason: String,
    },
    /// Two entries have one identifier: which key it names is ambiguous.
    #[error(
        "public_keys[{index}]: the identifier `{identifier}` is already that of \
         public_keys[{first}]; list each key once"
    )]
    DuplicateIdentifier {
        /// The later entry's place in `public_keys`.
        index: usize,
        /// The earlier entry's place.
        first: usize,
        /// The identifier.
        identifier: String,
    },
}

/// Why an alert's signature was not accepted; each message suits a 401
/// body.
#[derive(Clone, Copy, Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignatureError {
    /// The identifier names no configured key.
    #[error(
        "the Github-Public-Key-Identifier header names no secret-scanning key known here; \
         the gateway's copy of GitHub's keys may need renewing"
    )]
    UnknownIdentifier,
    /// The signature is not standard padded base64 of a DER ECDSA P-256
    /// signature.
    #[error("the Github-Public-Key-Signature header is not a base64 DER ECDSA P-256 signature")]
    MalformedSignature,
    /// A well-formed signature that this key did not make over this body.
    #[error(
        "the Github-Public-Key-Signature header does not match the request body \
         for the key the Github-Public-Key-Identifier header names"
    )]
    Mismatch,
}

/// The published document's outer shape, keeping each entry's text so that
/// its fields can be read with duplicates refused.
#[derive(Deserialize)]
struct Published<'a> {
    #[serde(borrow)]
    public_keys: Vec<&'a RawValue>,
}

impl ScanningKeys {
    /// Reads GitHub's key document (see the type's docs). Refused: a
    /// document of another shape, no keys, a key that is not a P-256 public
    /// key in SPKI PEM form, an identifier that is not 1 to
    /// [`MAX_KEY_IDENTIFIER_CHARS`] visible ASCII characters, two entries
    /// with one identifier, a field given twice. Other fields are ignored.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ScanningKeysError> {
        let mut top = top_level_fields(bytes).map_err(|error| match error {
            JsonBodyError::NotJson(reason) => ScanningKeysError::NotJson(reason),
            JsonBodyError::NotObject(found) => ScanningKeysError::NotAnObject(found),
            JsonBodyError::Duplicate(field) => ScanningKeysError::DuplicateField(field),
        })?;
        match top.remove("public_keys") {
            None => return Err(ScanningKeysError::MissingKeys),
            Some(Value::Array(entries)) if entries.is_empty() => {
                return Err(ScanningKeysError::NoKeys);
            }
            Some(Value::Array(_)) => {}
            Some(other) => return Err(ScanningKeysError::KeysNotAnArray(json_type(&other))),
        }
        // Read again for each entry's own text: a field given twice inside
        // an entry is refused too, which the parse above cannot see.
        let Published { public_keys } = serde_json::from_slice(bytes)
            .map_err(|error| ScanningKeysError::NotJson(json_error_reason(&error)))?;
        let mut keys: Vec<ScanningKey> = Vec::with_capacity(public_keys.len());
        for (index, entry) in public_keys.into_iter().enumerate() {
            let key = parse_entry(index, entry)?;
            if let Some(first) = keys
                .iter()
                .position(|known| known.identifier == key.identifier)
            {
                return Err(ScanningKeysError::DuplicateIdentifier {
                    index,
                    first,
                    identifier: key.identifier,
                });
            }
            keys.push(key);
        }
        Ok(ScanningKeys { keys })
    }

    /// How many keys there are.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are none (never, for keys read by [`Self::from_json`]).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The keys' identifiers, in the document's order.
    pub fn identifiers(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|key| key.identifier.as_str())
    }

    /// Checks `signature_b64` (the `Github-Public-Key-Signature` header:
    /// standard padded base64 of an ASN.1 DER ECDSA P-256 / SHA-256
    /// signature) over `body` (the raw request body, exactly as received,
    /// never re-serialised) with the key named `identifier` (the
    /// `Github-Public-Key-Identifier` header).
    pub fn verify(
        &self,
        identifier: &str,
        signature_b64: &str,
        body: &[u8],
    ) -> Result<(), SignatureError> {
        let key = self
            .keys
            .iter()
            .find(|key| key.identifier == identifier)
            .ok_or(SignatureError::UnknownIdentifier)?;
        if signature_b64.len() > MAX_SIGNATURE_BASE64 {
            return Err(SignatureError::MalformedSignature);
        }
        let der = STANDARD
            .decode(signature_b64)
            .map_err(|_| SignatureError::MalformedSignature)?;
        let signature =
            Signature::from_der(&der).map_err(|_| SignatureError::MalformedSignature)?;
        // SHA-256 of the body, then ECDSA: the `Verifier` of a P-256 key.
        key.key
            .verify(body, &signature)
            .map_err(|_| SignatureError::Mismatch)
    }
}

impl fmt::Debug for ScanningKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScanningKeys")
            .field("identifiers", &self.identifiers().collect::<Vec<_>>())
            .finish()
    }
}

fn parse_entry(index: usize, entry: &RawValue) -> Result<ScanningKey, ScanningKeysError> {
    let mut fields = top_level_fields(entry.get().as_bytes()).map_err(|error| match error {
        JsonBodyError::NotJson(reason) => ScanningKeysError::NotJson(reason),
        JsonBodyError::NotObject(found) => ScanningKeysError::EntryNotAnObject { index, found },
        JsonBodyError::Duplicate(field) => ScanningKeysError::EntryDuplicateField { index, field },
    })?;
    let identifier = string_field(&mut fields, index, "key_identifier")?;
    if identifier.is_empty()
        || identifier.len() > MAX_KEY_IDENTIFIER_CHARS
        || !identifier.bytes().all(|byte| byte.is_ascii_graphic())
    {
        return Err(ScanningKeysError::BadIdentifier { index });
    }
    let pem = string_field(&mut fields, index, "key")?;
    // Whether GitHub still signs with it does not matter here (see the
    // type's docs), but a wrong type means a document of another shape.
    match fields.remove("is_current") {
        None | Some(Value::Null | Value::Bool(_)) => {}
        Some(other) => {
            return Err(ScanningKeysError::WrongType {
                index,
                field: "is_current",
                expected: "a boolean",
                found: json_type(&other),
            });
        }
    }
    // Hand-written configuration may indent or end the PEM differently.
    let key = VerifyingKey::from_public_key_pem(pem.trim()).map_err(|error| {
        ScanningKeysError::BadKey {
            index,
            identifier: identifier.clone(),
            reason: error.to_string(),
        }
    })?;
    Ok(ScanningKey { identifier, key })
}

fn string_field(
    fields: &mut Map<String, Value>,
    index: usize,
    field: &'static str,
) -> Result<String, ScanningKeysError> {
    match fields.remove(field) {
        None => Err(ScanningKeysError::MissingField { index, field }),
        Some(Value::String(text)) => Ok(text),
        Some(other) => Err(ScanningKeysError::WrongType {
            index,
            field,
            expected: "a string",
            found: json_type(&other),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::Signer as _;
    use p256::ecdsa::{DerSignature, SigningKey};
    use p256::elliptic_curve::Generate as _;
    use p256::elliptic_curve::ff::PrimeField as _;
    use p256::pkcs8::{EncodePublicKey as _, LineEnding};
    use proptest::prelude::*;
    use serde_json::json;
    use std::sync::LazyLock;

    // GitHub's published secret-scanning keys and the sample request its
    // partner-program documentation signs with the current one.
    const GITHUB_OLD_ID: &str = "90a421169f0a406205f1563a953312f0be898d3c7b6c06b681aa86a874555f4a";
    const GITHUB_OLD_KEY: &str = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE9MJJHnMfn2+H4xL4YaPDA4RpJqUq\nkCmRCBnYERxZanmcpzQSXs1X/AljlKkbJ8qpVIW4clayyef9gWhFbNHWAA==\n-----END PUBLIC KEY-----\n";
    const GITHUB_ID: &str = "bcb53661c06b4728e59d897fb6165d5c9cda0fd9cdf9d09ead458168deb7518c";
    const GITHUB_KEY: &str = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEYAGMWO8XgCamYKMJS6jc/qgvSlAd\nAjPuDPRcXU22YxgBrz+zoN19MzuRyW87qEt9/AmtoNP5GrobzUvQSyJFVw==\n-----END PUBLIC KEY-----\n";
    const GITHUB_SIGNATURE: &str = "MEQCIQDaMKqrGnE27S0kgMrEK0eYBmyG0LeZismAEz/BgZyt7AIfXt9fErtRS4XaeSt/AO1RtBY66YcAdjxji410VQV4xg==";
    const GITHUB_BODY: &[u8] = br#"[{"source":"commit","token":"some_token","type":"some_type","url":"https://example.com/base-repo-url/"}]"#;

    fn github_keys() -> ScanningKeys {
        let document = json!({"public_keys": [
            {"key_identifier": GITHUB_OLD_ID, "key": GITHUB_OLD_KEY, "is_current": false},
            {"key_identifier": GITHUB_ID, "key": GITHUB_KEY, "is_current": true},
        ]});
        ScanningKeys::from_json(document.to_string().as_bytes()).unwrap()
    }

    /// A fresh key pair, its public half in GitHub's document shape.
    fn key_pair(identifier: &str) -> (SigningKey, ScanningKeys) {
        let signing = SigningKey::generate();
        let pem = signing
            .verifying_key()
            .to_public_key_pem(LineEnding::LF)
            .unwrap();
        let document = json!({"public_keys": [{"key_identifier": identifier, "key": pem, "is_current": true}]});
        (
            signing,
            ScanningKeys::from_json(document.to_string().as_bytes()).unwrap(),
        )
    }

    /// The header GitHub would send: base64 of the DER signature.
    fn sign(key: &SigningKey, body: &[u8]) -> String {
        let signature: DerSignature = key.sign(body);
        STANDARD.encode(signature.as_bytes())
    }

    static SIGNER: LazyLock<(SigningKey, ScanningKeys)> = LazyLock::new(|| key_pair("k1"));

    #[test]
    fn githubs_documented_sample_verifies_with_its_published_key() {
        let keys = github_keys();
        assert_eq!(keys.len(), 2);
        assert!(!keys.is_empty());
        assert_eq!(
            keys.verify(GITHUB_ID, GITHUB_SIGNATURE, GITHUB_BODY),
            Ok(())
        );
        // Strict base64: GitHub pads, so padding left out is refused.
        assert_eq!(
            keys.verify(
                GITHUB_ID,
                GITHUB_SIGNATURE.trim_end_matches('='),
                GITHUB_BODY
            ),
            Err(SignatureError::MalformedSignature)
        );
        // The other published key did not sign it.
        assert_eq!(
            keys.verify(GITHUB_OLD_ID, GITHUB_SIGNATURE, GITHUB_BODY),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            format!("{keys:?}"),
            format!(r#"ScanningKeys {{ identifiers: ["{GITHUB_OLD_ID}", "{GITHUB_ID}"] }}"#)
        );
        assert_eq!(
            keys.identifiers().collect::<Vec<_>>(),
            [GITHUB_OLD_ID, GITHUB_ID]
        );
    }

    #[test]
    fn a_signature_verifies_only_for_its_body_its_key_and_its_encoding() {
        let (signing, keys) = key_pair("k1");
        // The key is new each run; take a body whose signature has a
        // character the URL-safe alphabet spells otherwise, so the
        // URL-safe encoding below is always a different string.
        let (body, signature) = (0..)
            .map(|n| format!(r#"[{{"token":"mg-v1-x{n}","type":"modelgate_key"}}]"#))
            .map(|body| {
                let signature = sign(&signing, body.as_bytes());
                (body, signature)
            })
            .find(|(_, signature)| signature.contains(['+', '/']))
            .unwrap();
        let body = body.as_bytes();
        assert_eq!(keys.verify("k1", &signature, body), Ok(()));

        let mut changed = body.to_vec();
        changed[12] ^= 1;
        assert_eq!(
            keys.verify("k1", &signature, &changed),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            keys.verify("k1", &signature, &body[..body.len() - 1]),
            Err(SignatureError::Mismatch)
        );
        let (other, _) = key_pair("k2");
        assert_eq!(
            keys.verify("k1", &sign(&other, body), body),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            keys.verify("k2", &signature, body),
            Err(SignatureError::UnknownIdentifier)
        );
        assert_eq!(
            keys.verify("K1", &signature, body),
            Err(SignatureError::UnknownIdentifier)
        );
        assert_eq!(
            keys.verify("", &signature, body),
            Err(SignatureError::UnknownIdentifier)
        );

        let der: DerSignature = signing.sign(body);
        let der = der.as_bytes();
        let fixed: Signature = signing.sign(body);
        let mut malformed = vec![
            // Truncated: the DER, or its base64.
            STANDARD.encode(&der[..der.len() - 1]),
            signature[..signature.len() - 4].to_owned(),
            // Other encodings of the same signature.
            STANDARD.encode(fixed.to_bytes()),
            hex::encode(der),
            base64::engine::general_purpose::URL_SAFE.encode(der),
            format!(" {signature}"),
            format!("{signature}\n"),
            // DER with something after it.
            STANDARD.encode([der, &[0][..]].concat()),
            String::new(),
            "A".repeat(10_000),
        ];
        // Padding left out, where the length needs some (a 72-byte DER
        // signature needs none).
        let unpadded = base64::engine::general_purpose::STANDARD_NO_PAD.encode(der);
        if unpadded != signature {
            malformed.push(unpadded);
        }
        for bad in malformed {
            assert_eq!(
                keys.verify("k1", &bad, body),
                Err(SignatureError::MalformedSignature),
                "{bad:?}"
            );
        }
        // An unknown key is named before the signature is read.
        assert_eq!(
            keys.verify("k2", "", body),
            Err(SignatureError::UnknownIdentifier)
        );
    }

    #[test]
    fn high_s_signatures_verify_as_go_may_send_them() {
        // GitHub signs with Go's crypto/ecdsa, which does not normalise s:
        // (r, n - s) is as valid as (r, s).
        let (signing, keys) = &*SIGNER;
        let body = b"[]";
        let signature: Signature = signing.sign(body);
        let (r, s) = signature.split_scalars();
        let flipped = Signature::from_scalars(r.to_repr(), (-*s).to_repr()).unwrap();
        let flipped = STANDARD.encode(flipped.to_der().as_bytes());
        assert_eq!(keys.verify("k1", &flipped, body), Ok(()));
    }

    #[test]
    fn signature_errors_say_what_to_check() {
        assert_eq!(
            SignatureError::UnknownIdentifier.to_string(),
            "the Github-Public-Key-Identifier header names no secret-scanning key known here; \
             the gateway's copy of GitHub's keys may need renewing"
        );
        assert_eq!(
            SignatureError::MalformedSignature.to_string(),
            "the Github-Public-Key-Signature header is not a base64 DER ECDSA P-256 signature"
        );
        assert_eq!(
            SignatureError::Mismatch.to_string(),
            "the Github-Public-Key-Signature header does not match the request body \
             for the key the Github-Public-Key-Identifier header names"
        );
    }

    fn keys_error(document: &str) -> String {
        ScanningKeys::from_json(document.as_bytes())
            .unwrap_err()
            .to_string()
    }

    fn entry(identifier: &str, key: &str) -> Value {
        json!({"key_identifier": identifier, "key": key, "is_current": true})
    }

    #[test]
    fn the_key_document_must_have_githubs_shape() {
        let cases = [
            (
                "{",
                "the secret-scanning keys are not valid JSON: EOF while parsing an object at line 1, column 1",
            ),
            (
                "[]",
                "the secret-scanning keys must be a JSON object with a `public_keys` array, as GitHub publishes them, not an array",
            ),
            (
                r#"{"public_keys": [], "public_keys": []}"#,
                "the secret-scanning keys have the field `public_keys` twice; each field may appear once",
            ),
            (
                r#"{"keys": []}"#,
                "the secret-scanning keys have no `public_keys` array",
            ),
            (
                r#"{"public_keys": {}}"#,
                "`public_keys` must be an array, not an object",
            ),
            (
                r#"{"public_keys": null}"#,
                "`public_keys` must be an array, not null",
            ),
            (r#"{"public_keys": []}"#, "`public_keys` lists no keys"),
            (
                r#"{"public_keys": ["k"]}"#,
                "public_keys[0] must be an object with `key_identifier` and `key`, not a string",
            ),
            (
                r#"{"public_keys": [{"key": "k"}]}"#,
                "public_keys[0]: `key_identifier` is required",
            ),
            (
                r#"{"public_keys": [{"key_identifier": 1, "key": "k"}]}"#,
                "public_keys[0]: `key_identifier` must be a string, not a number",
            ),
            (
                r#"{"public_keys": [{"key_identifier": "a"}]}"#,
                "public_keys[0]: `key` is required",
            ),
            (
                r#"{"public_keys": [{"key_identifier": "a", "key": null}]}"#,
                "public_keys[0]: `key` must be a string, not null",
            ),
            (
                r#"{"public_keys": [{"key_identifier": "a", "key": "k", "key": "k"}]}"#,
                "public_keys[0] has the field `key` twice; each field may appear once",
            ),
            (
                r#"{"public_keys": [{"key_identifier": "", "key": "k"}]}"#,
                "public_keys[0]: `key_identifier` must be 1 to 256 visible ASCII characters",
            ),
            (
                r#"{"public_keys": [{"key_identifier": "a b", "key": "k"}]}"#,
                "public_keys[0]: `key_identifier` must be 1 to 256 visible ASCII characters",
            ),
            (
                r#"{"public_keys": [{"key_identifier": "é", "key": "k"}]}"#,
                "public_keys[0]: `key_identifier` must be 1 to 256 visible ASCII characters",
            ),
        ];
        for (document, message) in cases {
            assert_eq!(keys_error(document), message, "{document}");
        }
        let long = json!({"public_keys": [entry(&"a".repeat(257), GITHUB_KEY)]}).to_string();
        assert_eq!(
            keys_error(&long),
            "public_keys[0]: `key_identifier` must be 1 to 256 visible ASCII characters"
        );
        let longest = json!({"public_keys": [entry(&"~".repeat(256), GITHUB_KEY)]}).to_string();
        assert_eq!(
            ScanningKeys::from_json(longest.as_bytes()).unwrap().len(),
            1
        );

        let bad_current = json!({"public_keys": [{"key_identifier": "a", "key": GITHUB_KEY, "is_current": "yes"}]});
        assert_eq!(
            keys_error(&bad_current.to_string()),
            "public_keys[0]: `is_current` must be a boolean, not a string"
        );
        let twice = json!({"public_keys": [entry("a", GITHUB_KEY), entry("b", GITHUB_OLD_KEY), entry("a", GITHUB_OLD_KEY)]});
        assert_eq!(
            keys_error(&twice.to_string()),
            "public_keys[2]: the identifier `a` is already that of public_keys[0]; list each key once"
        );
    }

    #[test]
    fn a_key_must_be_a_p256_spki_pem() {
        // P-384, an RSA key, the P-256 private key, bare base64, a PEM
        // whose body is cut.
        let p384 = "-----BEGIN PUBLIC KEY-----\nMHYwEAYHKoZIzj0CAQYFK4EEACIDYgAED6rRcLaE+mFmsrkhOp9gE4dLRrP8LDan\nFe31H6WfpDIFLH0/DNwxCfXVuS8yu24ax1DvHg8ajLqZcxLZKON3w7RZXxJj82NS\n+kRCS3yq1GaPkNZqvD56AyE8pfKeFq2d\n-----END PUBLIC KEY-----\n";
        let rsa = "-----BEGIN PUBLIC KEY-----\nMIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQCylslJCuih3n4M6y38Uz3PqGzg\nb8QI11HjiYuCCuPRuHtq23FgqYGCdBr696hXagMhcylof/nbE75tTY5wjQGgM4KN\nKWZUt6ncUk78WExccJjuc19qisKILiTHkWgdBiJpEySTiCvF4Al2PUT+Lhfn5FRE\nH6MUaOvrzOZETLpotQIDAQAB\n-----END PUBLIC KEY-----\n";
        let private = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgtlCRGqWJO9fNRX7P\nBpguC+PrtnWH8SsmDoqV1M08JZmhRANCAATEbIcnN13pcWtaQi/WfzYBsILSz3SF\n9QK2ojITsY/My/BZkXIsEVCwo5ZhmsTb0NMzntD6yjKqaH4eq7FB67+z\n-----END PRIVATE KEY-----\n";
        let bare = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEYAGMWO8XgCamYKMJS6jc/qgvSlAdAjPuDPRcXU22YxgBrz+zoN19MzuRyW87qEt9/AmtoNP5GrobzUvQSyJFVw==";
        let cut = GITHUB_KEY.replace("Vw==", "");
        for key in [p384, rsa, private, bare, &cut, ""] {
            let document =
                json!({"public_keys": [entry(GITHUB_ID, GITHUB_KEY), entry("bad", key)]});
            let error = ScanningKeys::from_json(document.to_string().as_bytes()).unwrap_err();
            let ScanningKeysError::BadKey {
                index: 1,
                ref identifier,
                ref reason,
            } = error
            else {
                panic!("{key:?}: {error}");
            };
            assert_eq!(identifier, "bad");
            assert!(!reason.is_empty());
            assert_eq!(
                error.to_string(),
                format!(
                    "public_keys[1] (`bad`): `key` is not a P-256 public key in PEM form \
                     (-----BEGIN PUBLIC KEY-----): {reason}"
                )
            );
        }
        // Indented or without the last newline, as hand-written
        // configuration may have it, it still reads.
        for key in [GITHUB_KEY.trim_end(), &format!("\n  {GITHUB_KEY}")] {
            let document = json!({"public_keys": [entry(GITHUB_ID, key)]});
            let keys = ScanningKeys::from_json(document.to_string().as_bytes()).unwrap();
            assert_eq!(
                keys.verify(GITHUB_ID, GITHUB_SIGNATURE, GITHUB_BODY),
                Ok(())
            );
        }
        // Fields GitHub may add are ignored; `is_current` may be absent.
        let document = json!({"public_keys": [{"key_identifier": GITHUB_ID, "key": GITHUB_KEY, "algorithm": "ES256"}], "etag": "x"});
        assert!(ScanningKeys::from_json(document.to_string().as_bytes()).is_ok());
    }

    proptest! {
        #[test]
        fn verify_never_panics(
            identifier in prop_oneof![Just("k1".to_owned()), ".{0,8}"],
            signature in prop_oneof![
                "[A-Za-z0-9+/=]{0,100}",
                prop::collection::vec(any::<u8>(), 0..80).prop_map(|der| STANDARD.encode(der)),
                ".{0,100}",
            ],
            body in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let (_, keys) = &*SIGNER;
            let _ = keys.verify(&identifier, &signature, &body);
        }

        #[test]
        fn from_json_never_panics(document in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = ScanningKeys::from_json(&document);
        }
    }

    proptest! {
        // Signing is slow unoptimised: fewer cases.
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn a_signature_verifies_only_for_the_exact_body_it_signed(
            body in prop::collection::vec(any::<u8>(), 1..200),
            at in any::<prop::sample::Index>(),
            flip in 1u8..=255,
        ) {
            let (signing, keys) = &*SIGNER;
            let signature = sign(signing, &body);
            prop_assert_eq!(keys.verify("k1", &signature, &body), Ok(()));
            let mut changed = body.clone();
            changed[at.index(body.len())] ^= flip;
            prop_assert_eq!(keys.verify("k1", &signature, &changed), Err(SignatureError::Mismatch));
        }
    }
}
