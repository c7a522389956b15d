//! Proof Key for Code Exchange (RFC 7636): the app makes a secret
//! `code_verifier`, sends only its `code_challenge` with the person to the
//! consent page, and must show the verifier to exchange the code. Whoever
//! intercepts the code alone (a redirect logged, a URL leaked) cannot use it.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The shortest `code_verifier` RFC 7636 allows, in characters.
pub const MIN_VERIFIER_CHARS: usize = 43;
/// The longest `code_verifier` RFC 7636 allows, in characters.
pub const MAX_VERIFIER_CHARS: usize = 128;
/// The length of an `S256` challenge: base64url without padding of the
/// 32 bytes of a SHA-256.
pub const S256_CHALLENGE_CHARS: usize = 43;

/// How the challenge was derived from the verifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ChallengeMethod {
    /// `S256`: the challenge is base64url-no-pad(SHA-256(verifier)). The
    /// one to use: the challenge, which travels through the browser,
    /// gives the verifier away to nobody.
    #[serde(rename = "S256")]
    S256,
    /// `plain`: the challenge is the verifier itself. RFC 7636 keeps it for
    /// clients that cannot hash; it protects only against a code
    /// intercepted without the authorization request.
    #[serde(rename = "plain")]
    Plain,
}

impl ChallengeMethod {
    /// The method named exactly `S256` or `plain` (RFC 7636 spells them so;
    /// no other spelling is taken).
    pub fn parse(text: &str) -> Option<ChallengeMethod> {
        match text {
            "S256" => Some(ChallengeMethod::S256),
            "plain" => Some(ChallengeMethod::Plain),
            _ => None,
        }
    }

    /// Its name as RFC 7636 writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            ChallengeMethod::S256 => "S256",
            ChallengeMethod::Plain => "plain",
        }
    }
}

impl fmt::Display for ChallengeMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether approvals may use the `plain` method. Off by default: with
/// `plain` the verifier itself travels in the consent page's URL (browser
/// history, logs, the `Referer` of anything the page loads), so whoever
/// sees that URL can exchange the code. RFC 7636 keeps `plain` only for
/// clients that cannot hash, and every browser and language can.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PlainPkce {
    /// Only `S256`: `plain`, or an approval that names no method, is a 400.
    #[default]
    Refused,
    /// `S256` or `plain`; an approval that names no method is `plain`, as
    /// RFC 7636 reads it.
    Allowed,
}

/// RFC 7636's unreserved characters, the alphabet of a verifier (and of a
/// `plain` challenge): `A-Z a-z 0-9 - . _ ~`.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// Whether `verifier` is a well-formed `code_verifier`: 43 to 128
/// unreserved characters.
pub fn is_valid_verifier(verifier: &str) -> bool {
    (MIN_VERIFIER_CHARS..=MAX_VERIFIER_CHARS).contains(&verifier.len())
        && verifier.bytes().all(is_unreserved)
}

/// Whether `challenge` is a well-formed challenge for `method`: for `S256`
/// the base64url (no padding, canonical) of 32 bytes; for `plain` a
/// well-formed verifier.
pub fn is_valid_challenge(method: ChallengeMethod, challenge: &str) -> bool {
    match method {
        ChallengeMethod::S256 => s256_digest(challenge).is_some(),
        ChallengeMethod::Plain => is_valid_verifier(challenge),
    }
}

/// The 32 bytes an `S256` challenge encodes, when it is exactly 43
/// base64url characters with no stray bits.
fn s256_digest(challenge: &str) -> Option<[u8; 32]> {
    if challenge.len() != S256_CHALLENGE_CHARS {
        return None;
    }
    // The engine refuses padding and non-zero trailing bits, so each
    // digest has one spelling.
    URL_SAFE_NO_PAD.decode(challenge).ok()?.try_into().ok()
}

/// The `S256` challenge of `verifier`: base64url-no-pad(SHA-256(verifier)),
/// what an app sends to the consent page.
pub fn s256_challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// Whether `verifier` answers `challenge` under `method`. The comparison
/// takes the same time wherever the first difference is, so timing tells
/// nothing of the challenge. A malformed verifier or challenge never
/// matches.
pub fn verifier_matches(method: ChallengeMethod, challenge: &str, verifier: &str) -> bool {
    if !is_valid_verifier(verifier) {
        return false;
    }
    match method {
        ChallengeMethod::S256 => {
            let Some(expected) = s256_digest(challenge) else {
                return false;
            };
            let actual: [u8; 32] = Sha256::digest(verifier.as_bytes()).into();
            expected.ct_eq(&actual).into()
        }
        // Lengths may differ; `ct_eq` of slices says so without looking
        // at the bytes, and a length is no secret (43 to 128, known).
        ChallengeMethod::Plain => challenge.as_bytes().ct_eq(verifier.as_bytes()).into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 7636, appendix B.
    const RFC_VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
    const RFC_CHALLENGE: &str = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";

    #[test]
    fn s256_follows_the_rfc_example() {
        assert_eq!(s256_challenge(RFC_VERIFIER), RFC_CHALLENGE);
        assert!(is_valid_challenge(ChallengeMethod::S256, RFC_CHALLENGE));
        assert!(verifier_matches(
            ChallengeMethod::S256,
            RFC_CHALLENGE,
            RFC_VERIFIER
        ));
        let mut wrong = RFC_VERIFIER.to_owned();
        wrong.replace_range(0..1, "e");
        assert!(!verifier_matches(
            ChallengeMethod::S256,
            RFC_CHALLENGE,
            &wrong
        ));
        // The challenge is not the verifier: sending it back does not pass.
        assert!(!verifier_matches(
            ChallengeMethod::S256,
            RFC_CHALLENGE,
            RFC_CHALLENGE
        ));
    }

    #[test]
    fn plain_is_the_verifier_itself() {
        assert!(verifier_matches(
            ChallengeMethod::Plain,
            RFC_VERIFIER,
            RFC_VERIFIER
        ));
        assert!(!verifier_matches(
            ChallengeMethod::Plain,
            RFC_VERIFIER,
            &format!("{RFC_VERIFIER}a")
        ));
        assert!(!verifier_matches(
            ChallengeMethod::Plain,
            RFC_CHALLENGE,
            RFC_VERIFIER
        ));
    }

    #[test]
    fn methods_are_spelled_as_the_rfc_spells_them() {
        assert_eq!(ChallengeMethod::parse("S256"), Some(ChallengeMethod::S256));
        assert_eq!(
            ChallengeMethod::parse("plain"),
            Some(ChallengeMethod::Plain)
        );
        for other in ["s256", "PLAIN", "Plain", "S512", "", " S256", "S256 "] {
            assert_eq!(ChallengeMethod::parse(other), None, "{other:?}");
        }
        assert_eq!(
            serde_json::to_string(&ChallengeMethod::S256).unwrap(),
            "\"S256\""
        );
        assert_eq!(ChallengeMethod::Plain.to_string(), "plain");
    }

    #[test]
    fn verifiers_and_challenges_have_their_shapes() {
        assert!(is_valid_verifier(&"a".repeat(43)));
        assert!(is_valid_verifier(&"~._-".repeat(32)));
        assert!(!is_valid_verifier(&"a".repeat(42)));
        assert!(!is_valid_verifier(&"a".repeat(129)));
        assert!(!is_valid_verifier(&format!("{}+", "a".repeat(42))));
        assert!(!is_valid_verifier(&format!("{}é", "a".repeat(42))));
        // Padding, the standard alphabet, stray bits and other lengths.
        assert!(!is_valid_challenge(
            ChallengeMethod::S256,
            &format!("{RFC_CHALLENGE}=")
        ));
        assert!(!is_valid_challenge(
            ChallengeMethod::S256,
            &RFC_CHALLENGE.replace('-', "+")
        ));
        assert!(!is_valid_challenge(
            ChallengeMethod::S256,
            &format!("{}N", &RFC_CHALLENGE[..42])
        ));
        assert!(!is_valid_challenge(
            ChallengeMethod::S256,
            &RFC_CHALLENGE[..42]
        ));
        assert!(!is_valid_challenge(ChallengeMethod::S256, &"a".repeat(64)));
        assert!(is_valid_challenge(ChallengeMethod::Plain, &"a".repeat(64)));
        // A malformed verifier never matches, even its own plain challenge.
        assert!(!verifier_matches(ChallengeMethod::Plain, "short", "short"));
    }

    proptest! {
        #[test]
        fn every_verifier_matches_its_own_s256_challenge_only(
            verifier in "[A-Za-z0-9._~-]{43,128}",
            other in "[A-Za-z0-9._~-]{43,128}",
        ) {
            let challenge = s256_challenge(&verifier);
            prop_assert!(is_valid_challenge(ChallengeMethod::S256, &challenge));
            prop_assert!(verifier_matches(ChallengeMethod::S256, &challenge, &verifier));
            prop_assert_eq!(
                verifier_matches(ChallengeMethod::S256, &challenge, &other),
                other == verifier
            );
            prop_assert!(verifier_matches(ChallengeMethod::Plain, &verifier, &verifier));
            prop_assert_eq!(
                verifier_matches(ChallengeMethod::Plain, &verifier, &other),
                other == verifier
            );
        }

        #[test]
        fn no_text_panics_the_checks(challenge in "\\PC{0,140}", verifier in "\\PC{0,140}") {
            for method in [ChallengeMethod::S256, ChallengeMethod::Plain] {
                let valid = is_valid_challenge(method, &challenge);
                let matches = verifier_matches(method, &challenge, &verifier);
                // Only a well-formed pair can match.
                prop_assert!(!matches || (valid && is_valid_verifier(&verifier)));
            }
        }
    }
}
