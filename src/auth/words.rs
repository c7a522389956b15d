//! What BearerAuth's refusals call the service: the realm of its
//! `WWW-Authenticate` challenge and the product its keys belong to.

use std::fmt;

use http::HeaderValue;

/// The realm and product name a stack has unless it names its own.
pub const DEFAULT_PRODUCT: &str = "modelgate";

/// The challenge of the default realm.
const DEFAULT_CHALLENGE: &str = "Bearer realm=\"modelgate\"";

/// The words of BearerAuth's 401s: the challenge's realm and the product
/// named in messages ("your acme key").
#[derive(Clone)]
pub(crate) struct AuthWords {
    /// The product named in messages.
    pub(crate) product: String,
    /// `Bearer realm="…"`, for a request without a key.
    pub(crate) challenge: HeaderValue,
    /// `Bearer realm="…", error="invalid_token"`, for a bad key.
    pub(crate) invalid_token: HeaderValue,
}

impl AuthWords {
    /// The words with `realm`, which must be printable ASCII without `"`
    /// or `\` (so it needs no escaping in the challenge's quoted string).
    pub(crate) fn with_realm(self, realm: &str) -> Result<AuthWords, InvalidRealm> {
        let printable = |byte: u8| (0x20..0x7f).contains(&byte) && byte != b'"' && byte != b'\\';
        if realm.is_empty() || !realm.bytes().all(printable) {
            return Err(InvalidRealm);
        }
        let challenge = format!("Bearer realm=\"{realm}\"");
        let invalid_token = format!("{challenge}, error=\"invalid_token\"");
        Ok(AuthWords {
            challenge: HeaderValue::from_str(&challenge).map_err(|_| InvalidRealm)?,
            invalid_token: HeaderValue::from_str(&invalid_token).map_err(|_| InvalidRealm)?,
            ..self
        })
    }
}

impl AuthWords {
    /// Whether these are modelgate's own words (no realm or product set).
    pub(crate) fn are_default(&self) -> bool {
        // Asked on every accepted request: compared, nothing built.
        self.product == DEFAULT_PRODUCT && self.challenge == DEFAULT_CHALLENGE
    }
}

impl Default for AuthWords {
    fn default() -> Self {
        AuthWords {
            product: DEFAULT_PRODUCT.to_owned(),
            challenge: HeaderValue::from_static(DEFAULT_CHALLENGE),
            invalid_token: HeaderValue::from_static(
                "Bearer realm=\"modelgate\", error=\"invalid_token\"",
            ),
        }
    }
}

impl fmt::Debug for AuthWords {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthWords")
            .field("product", &self.product)
            .field("challenge", &self.challenge)
            .finish()
    }
}

/// A realm that cannot stand in a challenge's quoted string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InvalidRealm;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_realm_is_modelgate() {
        let words = AuthWords::default();
        assert_eq!(words.challenge, "Bearer realm=\"modelgate\"");
        assert_eq!(
            words.invalid_token,
            "Bearer realm=\"modelgate\", error=\"invalid_token\""
        );
    }

    #[test]
    fn only_modelgate_s_own_words_are_the_default() {
        assert!(AuthWords::default().are_default());
        // Naming the default realm again changes nothing.
        assert!(
            AuthWords::default()
                .with_realm(DEFAULT_PRODUCT)
                .unwrap()
                .are_default()
        );
        assert!(
            !AuthWords::default()
                .with_realm("acme")
                .unwrap()
                .are_default()
        );
        let renamed = AuthWords {
            product: "acme".into(),
            ..AuthWords::default()
        };
        assert!(!renamed.are_default());
    }

    #[test]
    fn a_realm_is_quoted_into_both_challenges() {
        let words = AuthWords::default().with_realm("acme api").unwrap();
        assert_eq!(words.challenge, "Bearer realm=\"acme api\"");
        assert_eq!(
            words.invalid_token,
            "Bearer realm=\"acme api\", error=\"invalid_token\""
        );
    }

    #[test]
    fn a_realm_that_needs_escaping_is_refused() {
        for realm in ["", "a\"b", "a\\b", "a\nb", "é"] {
            assert_eq!(
                AuthWords::default().with_realm(realm).map(|_| ()),
                Err(InvalidRealm),
                "{realm:?}"
            );
        }
    }
}
