//! Keys a service issued before it used modelgate, accepted beside
//! `mg-v1-` keys: by the SHA-256 of the token ([`ImportedKeys::prefixes`],
//! [`ImportedKeys::any_token`]) or by a verifier the service provides
//! ([`KeyVerifier`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::checked::CheckedKeys;
use crate::keys::{ApiKey, KeyHash, check_shape, checksum_matches};

/// A service's own keys that [`BearerAuthLayer::imported_keys`]
/// accepts: which presented tokens are the service's, and how such a
/// token becomes the [`KeyHash`] its record is stored under.
///
/// By default a token's identity is its SHA-256 ([`KeyHash::of`]), so a
/// service that keeps the SHA-256 of its keys registers them with
/// [`KeyDirectory::import_key_hash`](crate::keys::KeyDirectory::import_key_hash)
/// and never shows modelgate a plaintext. For keys kept otherwise (bcrypt,
/// HMAC with a pepper, another service), [`ImportedKeys::verified_by`]
/// hands the token to a [`KeyVerifier`].
///
/// A token that starts with `mg-v1-` is always read as a modelgate key
/// (a bad checksum is refused without a store read), whatever the shapes
/// say. `Debug` shows the prefixes (public shapes), never a token.
///
/// [`BearerAuthLayer::imported_keys`]: super::BearerAuthLayer::imported_keys
#[derive(Clone)]
pub struct ImportedKeys {
    /// `None`: any token.
    prefixes: Option<Vec<String>>,
    verifier: Option<Arc<dyn KeyVerifier>>,
}

impl ImportedKeys {
    /// Tokens that start with one of `prefixes` (`sk-live-`, compared
    /// exactly, case included). An empty prefix matches every token.
    pub fn prefixes<I, P>(prefixes: I) -> ImportedKeys
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        ImportedKeys {
            prefixes: Some(prefixes.into_iter().map(Into::into).collect()),
            verifier: None,
        }
    }

    /// Every token that is not a modelgate key: for services whose keys
    /// have no common prefix.
    pub fn any_token() -> ImportedKeys {
        ImportedKeys {
            prefixes: None,
            verifier: None,
        }
    }

    /// Hands these tokens to `verifier`, which names the [`KeyHash`] each
    /// is registered under, instead of taking their SHA-256.
    pub fn verified_by(mut self, verifier: impl KeyVerifier) -> ImportedKeys {
        self.verifier = Some(Arc::new(verifier));
        self
    }

    /// Whether `token` has one of these shapes (an `mg-v1-` token is
    /// still read as a modelgate key first, whatever this says).
    pub fn matches(&self, token: &str) -> bool {
        match &self.prefixes {
            None => true,
            Some(prefixes) => prefixes
                .iter()
                .any(|prefix| token.starts_with(prefix.as_str())),
        }
    }

    /// The prefixes named, for a message saying what keys look like.
    pub(crate) fn named_prefixes(&self) -> &[String] {
        self.prefixes.as_deref().unwrap_or_default()
    }

    /// Whether every token that is no modelgate key is one of these.
    pub(crate) fn takes_any_token(&self) -> bool {
        self.prefixes.is_none()
    }
}

impl fmt::Debug for ImportedKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImportedKeys")
            .field("prefixes", &self.prefixes)
            .field(
                "verifier",
                &self.verifier.as_ref().map(|_| "KeyVerifier(…)"),
            )
            .finish()
    }
}

/// Why a [`KeyVerifier`] could not decide: the request is answered 503
/// (authentication fails closed), never admitted.
pub type VerifierError = Box<dyn std::error::Error + Send + Sync>;

/// What a [`KeyVerifier`]'s check returns: the service's own id of the
/// key, `None` for a token that is no key of the service.
pub type Verification<'a> =
    Pin<Box<dyn Future<Output = Result<Option<String>, VerifierError>> + Send + 'a>>;

/// Maps a presented token to the service's own id of the key, for keys a
/// service hashed its own way. The key's record is the one imported under
/// [`KeyHash::verified`] of that id
/// ([`KeyDirectory::import_key_hash`](crate::keys::KeyDirectory::import_key_hash)):
/// an identity no token taken by its hash and no `mg-v1-` key has, so a
/// verifier reaches only the keys imported for it.
///
/// It runs before the key is known good, on every request presenting a
/// token of its shapes, good or not, so what it costs is the service's:
/// keep it cheap, or bound it (BearerAuth bounds only how many run at once,
/// with [`max_concurrent_lookups`](super::BearerAuthLayer::max_concurrent_lookups),
/// and stops an address past its failure limit before it). Compare secrets
/// in constant time. A plain function `Fn(&str) -> Option<String>` is a
/// verifier.
pub trait KeyVerifier: Send + Sync + 'static {
    /// The service's id of the key `token` is, or `None` when it is no key.
    fn verify<'a>(&'a self, token: &'a str) -> Verification<'a>;
}

impl<F> KeyVerifier for F
where
    F: Fn(&str) -> Option<String> + Send + Sync + 'static,
{
    fn verify<'a>(&'a self, token: &'a str) -> Verification<'a> {
        let verified = self(token);
        Box::pin(std::future::ready(Ok::<_, VerifierError>(verified)))
    }
}

/// What a presented token is, before any store read.
pub(crate) enum Presented {
    /// A key whose identity is this hash: a modelgate key, or an imported
    /// key taken by its SHA-256.
    Hash(KeyHash),
    /// A token (its text) for the service's verifier.
    Verify(Arc<dyn KeyVerifier>, String),
}

/// Why a presented token is refused without a store read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NotAKey {
    /// An `mg-v1-` key whose checksum does not match.
    BadChecksum,
    /// An `mg-v1-` token of the wrong length or characters, or a token of
    /// no imported shape.
    UnknownShape,
}

/// Reads a presented `token` (already a bounded token68 value): a
/// modelgate key, or the first of `imported` whose shape it has.
#[cfg(test)]
pub(crate) fn classify(token: &str, imported: &[ImportedKeys]) -> Result<Presented, NotAKey> {
    classify_checked(token, imported, None).map(|(presented, _)| presented)
}

/// [`classify`], skipping the checksum of an `mg-v1-` key `checked` holds:
/// the same text passed it before (the memo is keyed by its SHA-256).
/// Also says whether a checksum was checked now (an `mg-v1-` key the memo
/// did not hold), for the caller to remember once the key is found live.
pub(crate) fn classify_checked(
    token: &str,
    imported: &[ImportedKeys],
    checked: Option<&CheckedKeys>,
) -> Result<(Presented, bool), NotAKey> {
    if token.starts_with(ApiKey::PREFIX) {
        if check_shape(token).is_err() {
            return Err(NotAKey::UnknownShape);
        }
        let hash = KeyHash::of(token);
        let known = checked.is_some_and(|checked| checked.holds(&hash));
        if !known && !checksum_matches(token) {
            return Err(NotAKey::BadChecksum);
        }
        return Ok((Presented::Hash(hash), !known));
    }
    let shapes = imported.iter().find(|shapes| shapes.matches(token));
    let presented = match shapes {
        None => return Err(NotAKey::UnknownShape),
        Some(ImportedKeys {
            verifier: Some(verifier),
            ..
        }) => Presented::Verify(Arc::clone(verifier), token.to_owned()),
        Some(_) => Presented::Hash(KeyHash::of(token)),
    };
    Ok((presented, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hash_of(presented: Result<Presented, NotAKey>) -> Option<KeyHash> {
        match presented {
            Ok(Presented::Hash(hash)) => Some(hash),
            _ => None,
        }
    }

    fn live() -> Vec<ImportedKeys> {
        vec![ImportedKeys::prefixes(["sk-live-", "sk-test-"])]
    }

    #[test]
    fn a_checked_key_skips_only_its_own_checksum() {
        let key = ApiKey::generate();
        let checked = CheckedKeys::default();
        let first = classify_checked(key.expose(), &[], Some(&checked));
        assert!(matches!(first, Ok((Presented::Hash(hash), true)) if hash == key.hash()));
        checked.remember(key.hash());
        let again = classify_checked(key.expose(), &[], Some(&checked));
        assert!(matches!(again, Ok((Presented::Hash(hash), false)) if hash == key.hash()));
        // A mistyped copy of a checked key has a hash of its own: checked.
        let mut mistyped = key.expose().to_owned();
        let last = mistyped.pop().unwrap();
        mistyped.push(if last == 'a' { 'b' } else { 'a' });
        assert_eq!(
            classify_checked(&mistyped, &[], Some(&checked)).err(),
            Some(NotAKey::BadChecksum)
        );
        // The memo is what skips the checksum: a text it holds is trusted.
        checked.remember(KeyHash::of(&mistyped));
        assert!(classify_checked(&mistyped, &[], Some(&checked)).is_ok());
        // Its shape is checked whatever the memo holds.
        let short = &key.expose()[..ApiKey::LEN - 1];
        checked.remember(KeyHash::of(short));
        assert_eq!(
            classify_checked(short, &[], Some(&checked)).err(),
            Some(NotAKey::UnknownShape)
        );
    }

    #[test]
    fn a_modelgate_key_is_hashed_as_always() {
        let key = ApiKey::generate();
        assert!(hash_of(classify(key.expose(), &live())) == Some(key.hash()));
        assert!(hash_of(classify(key.expose(), &[])) == Some(key.hash()));
    }

    #[test]
    fn a_bad_checksum_is_refused_even_when_any_token_is_imported() {
        let key = ApiKey::generate();
        let text = key.expose();
        let last = if text.ends_with('A') { 'B' } else { 'A' };
        let mistyped = format!("{}{last}", &text[..text.len() - 1]);
        let any = [ImportedKeys::any_token()];
        assert_eq!(classify(&mistyped, &any).err(), Some(NotAKey::BadChecksum));
        assert_eq!(
            classify("mg-v1-short", &any).err(),
            Some(NotAKey::UnknownShape)
        );
    }

    #[test]
    fn an_imported_prefix_is_taken_by_its_sha256() {
        let token = "sk-live-abc123";
        assert!(hash_of(classify(token, &live())) == Some(KeyHash::of(token)));
        assert!(hash_of(classify("sk-test-x", &live())) == Some(KeyHash::of("sk-test-x")));
    }

    #[test]
    fn a_token_of_no_shape_is_unknown() {
        for token in ["sk-other-abc", "SK-LIVE-abc", "abc", "sk-live"] {
            assert_eq!(
                classify(token, &live()).err(),
                Some(NotAKey::UnknownShape),
                "{token}"
            );
            assert_eq!(
                classify(token, &[]).err(),
                Some(NotAKey::UnknownShape),
                "{token}"
            );
        }
    }

    #[test]
    fn any_token_takes_every_token_but_a_modelgate_one() {
        let any = [ImportedKeys::any_token()];
        assert!(hash_of(classify("whatever", &any)) == Some(KeyHash::of("whatever")));
    }

    #[test]
    fn the_first_matching_shape_decides() {
        let verifier = |token: &str| (token == "sk-live-good").then(|| "id-1".to_owned());
        let imported = [
            ImportedKeys::prefixes(["sk-live-"]).verified_by(verifier),
            ImportedKeys::any_token(),
        ];
        assert!(matches!(
            classify("sk-live-good", &imported),
            Ok(Presented::Verify(..))
        ));
        assert!(hash_of(classify("other", &imported)) == Some(KeyHash::of("other")));
        // The verified key's identity is no token's hash: the bare id,
        // taken by any_token(), is another key.
        assert!(hash_of(classify("id-1", &imported)) != Some(KeyHash::verified("id-1")));
    }

    #[test]
    fn debug_names_the_prefixes_and_hides_the_verifier() {
        let shapes =
            ImportedKeys::prefixes(["sk-live-"]).verified_by(|_: &str| -> Option<String> { None });
        assert_eq!(
            format!("{shapes:?}"),
            "ImportedKeys { prefixes: Some([\"sk-live-\"]), verifier: Some(\"KeyVerifier(…)\") }"
        );
    }

    #[tokio::test]
    async fn a_function_is_a_verifier() {
        let verifier = |token: &str| (token == "good").then(|| "id-1".to_owned());
        assert_eq!(
            verifier.verify("good").await.unwrap().as_deref(),
            Some("id-1")
        );
        assert!(verifier.verify("bad").await.unwrap().is_none());
    }

    proptest! {
        /// Any token: a modelgate-shaped one is never imported, one with
        /// an imported prefix is its SHA-256, any other is unknown.
        #[test]
        fn every_token_is_read_one_way(token in "[A-Za-z0-9._~+/-]{1,80}={0,2}") {
            let presented = classify(&token, &live());
            if token.starts_with(ApiKey::PREFIX) {
                let ours = ApiKey::parse(&token).ok().map(|key| key.hash());
                prop_assert!(hash_of(presented) == ours);
            } else if token.starts_with("sk-live-") || token.starts_with("sk-test-") {
                prop_assert!(hash_of(presented) == Some(KeyHash::of(&token)));
            } else {
                prop_assert_eq!(presented.err(), Some(NotAKey::UnknownShape));
            }
        }

        /// With a prefix put in front, a token is always imported.
        #[test]
        fn a_prefixed_token_is_imported(rest in "[A-Za-z0-9._~+/-]{0,80}") {
            let token = format!("sk-live-{rest}");
            prop_assert!(hash_of(classify(&token, &live())) == Some(KeyHash::of(&token)));
        }
    }
}
