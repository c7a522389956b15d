//! The modelgate key format, and the hash that is all the store keeps.
//!
//! See [`ApiKey`] for the format, written for scanner authors too.

use std::fmt;
use std::hash::{Hash, Hasher};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Base62 digits in value order, for the checksum.
const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
/// Random characters in a key: ⌈256 / log2(62)⌉.
const RANDOM_CHARS: usize = 43;
/// Base62 digits needed for any `u32`.
const CHECKSUM_CHARS: usize = 6;

/// A plaintext modelgate key; shown once at creation, never logged.
///
/// Only [`ApiKey::hash`] is stored. [`Debug`](fmt::Debug) prints
/// `ApiKey(mg-v1-…)` and there is no `Display`, so a key in a log line or a
/// panic message gives nothing away; [`ApiKey::expose`] is the one way to
/// the text.
///
/// # Format
///
/// A key is 55 ASCII characters:
///
/// ```text
/// mg-v1-<43 random base62 characters><6 base62 checksum characters>
/// ```
///
/// - `mg-v1-` names the issuer and the format's version, so a scanner can
///   tell a modelgate key from any other token.
/// - The 43 random characters are drawn uniformly from `0-9A-Za-z` by a
///   CSPRNG: 43 × log2(62) ≈ 256.03 bits.
/// - The checksum is the first 4 bytes of SHA-256 over the first 49
///   characters (prefix and random part), read as a big-endian `u32` and
///   written as 6 base62 digits, most significant first, zero padded, with
///   the digits in the order `0-9A-Za-z` (so `0` is 0, `A` is 10, `a` is
///   36). As 62^6 > 2^32, the first checksum digit is always `0` to `4`.
///
/// A secret scanner matches `mg-v1-[0-9A-Za-z]{49}` and then checks the
/// checksum offline, so random look-alikes are not reported: a random
/// 49-character tail passes with odds of 1 in 2^32. For example
/// `mg-v1-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefg2p0x4C` is well formed
/// (its checksum is `2p0x4C`).
///
/// A single changed character is always caught in the prefix and in the
/// checksum; in the random part it is missed only when the new SHA-256
/// happens to share its first 32 bits, 1 in 2^32.
///
/// ```
/// use modelgate::auth::{looks_like_key, ApiKey};
///
/// let key = ApiKey::generate();
/// assert_eq!(key.expose().len(), ApiKey::LEN);
/// assert!(looks_like_key(key.expose()));
/// assert_eq!(format!("{key:?}"), "ApiKey(mg-v1-…)");
/// assert!(ApiKey::parse(key.expose()).unwrap().hash() == key.hash());
/// ```
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    /// What every key starts with.
    pub const PREFIX: &'static str = "mg-v1-";
    /// A key's length, in characters (all ASCII, so also in bytes).
    pub const LEN: usize = Self::PREFIX.len() + RANDOM_CHARS + CHECKSUM_CHARS;

    /// A new key with 43 random base62 characters from the operating
    /// system's CSPRNG.
    pub fn generate() -> ApiKey {
        let mut text = String::with_capacity(Self::LEN);
        text.push_str(Self::PREFIX);
        text.push_str(&crate::random::alphanumeric(RANDOM_CHARS));
        let checksum = checksum(text.as_bytes());
        text.extend(checksum.iter().map(|&digit| char::from(digit)));
        ApiKey(text)
    }

    /// `text` as a key, if it is one: prefix, then characters, then length,
    /// then checksum, the first failure giving the error.
    ///
    /// ```
    /// use modelgate::auth::{ApiKey, KeyFormatError};
    ///
    /// assert!(ApiKey::parse("mg-v1-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefg2p0x4C").is_ok());
    /// assert_eq!(
    ///     ApiKey::parse("mg-v1-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefg2p0x4D").unwrap_err(),
    ///     KeyFormatError::BadChecksum,
    /// );
    /// ```
    pub fn parse(text: &str) -> Result<ApiKey, KeyFormatError> {
        check(text)?;
        Ok(ApiKey(text.to_owned()))
    }

    /// The plaintext, for the one response that shows it to its owner.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The key's hash: its id in the store and the management API.
    pub fn hash(&self) -> KeyHash {
        KeyHash::of(&self.0)
    }

    /// The key's first 3 random characters after its prefix and its last
    /// 4 (`mg-v1-Ab3…x9Qz`): enough to tell keys apart in a list, far too
    /// little to guess one (3 of its 43 random characters, and 4 of the
    /// checksum they make).
    pub fn hint(&self) -> String {
        let start = &self.0[..Self::PREFIX.len() + HINT_RANDOM_CHARS];
        let end = &self.0[self.0.len() - HINT_END_CHARS..];
        format!("{start}…{end}")
    }
}

/// How many of a key's random characters its [hint](ApiKey::hint) shows.
const HINT_RANDOM_CHARS: usize = 3;
/// How many of a key's last characters its [hint](ApiKey::hint) shows.
const HINT_END_CHARS: usize = 4;

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiKey({}…)", Self::PREFIX)
    }
}

/// Whether `text` is shaped like a modelgate key with a valid checksum: what
/// a secret scanner runs offline.
///
/// The same check as [`ApiKey::parse`], without keeping the key.
///
/// ```
/// use modelgate::auth::looks_like_key;
///
/// assert!(looks_like_key("mg-v1-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefg2p0x4C"));
/// assert!(!looks_like_key("mg-v1-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefh2p0x4C"));
/// ```
pub fn looks_like_key(text: &str) -> bool {
    check(text).is_ok()
}

fn check(text: &str) -> Result<(), KeyFormatError> {
    check_shape(text)?;
    match checksum_matches(text) {
        true => Ok(()),
        false => Err(KeyFormatError::BadChecksum),
    }
}

/// [`check`]'s every test but the checksum, in its order: what a key must
/// be before its checksum means anything.
pub(crate) fn check_shape(text: &str) -> Result<(), KeyFormatError> {
    let rest = text
        .strip_prefix(ApiKey::PREFIX)
        .ok_or(KeyFormatError::WrongPrefix)?;
    if !rest.bytes().all(|byte| byte.is_ascii_alphanumeric()) {
        return Err(KeyFormatError::InvalidCharacter);
    }
    if text.len() != ApiKey::LEN {
        return Err(KeyFormatError::WrongLength);
    }
    Ok(())
}

/// Whether the last characters of `text`, a key of the right
/// [shape](check_shape), are the checksum of the rest.
pub(crate) fn checksum_matches(text: &str) -> bool {
    // Split by bytes: any text splits, and a shaped key is all ASCII.
    let Some(cut) = text.len().checked_sub(CHECKSUM_CHARS) else {
        return false;
    };
    let (body, sum) = text.as_bytes().split_at(cut);
    checksum(body) == sum
}

/// The first 32 bits of SHA-256 over `body`, as 6 base62 digits.
fn checksum(body: &[u8]) -> [u8; CHECKSUM_CHARS] {
    let digest = Sha256::digest(body);
    let mut value = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    let mut digits = [b'0'; CHECKSUM_CHARS];
    for digit in digits.iter_mut().rev() {
        *digit = BASE62[(value % 62) as usize];
        value /= 62;
    }
    digits
}

/// Why a text is not a modelgate key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyFormatError {
    /// It does not start with `mg-v1-`.
    WrongPrefix,
    /// It is not [`ApiKey::LEN`] characters long.
    WrongLength,
    /// A character after the prefix is not base62 (`0-9A-Za-z`).
    InvalidCharacter,
    /// The last 6 characters are not the checksum of the rest: a typo, a
    /// truncated copy, or not a key at all.
    BadChecksum,
}

impl fmt::Display for KeyFormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let message = match self {
            KeyFormatError::WrongPrefix => "a modelgate key starts with `mg-v1-`",
            KeyFormatError::WrongLength => "a modelgate key is 55 characters long",
            KeyFormatError::InvalidCharacter => {
                "a modelgate key has only letters and digits after `mg-v1-`"
            }
            KeyFormatError::BadChecksum => {
                "the key's checksum does not match; it was mistyped or only partly copied"
            }
        };
        f.write_str(message)
    }
}

impl std::error::Error for KeyFormatError {}

/// The SHA-256 of a key's text: all the store keeps of a key.
///
/// Equality is constant time, so comparing a presented key's hash with a
/// stored one says nothing about how many bytes matched.
/// [`Debug`](fmt::Debug) prints `KeyHash(…)` and there is no `Display`:
/// the hex is an id to hand out on purpose, with [`KeyHash::to_hex`], not
/// by accident in a log line.
///
/// ```
/// use modelgate::auth::KeyHash;
///
/// let hash = KeyHash::of("abc");
/// assert_eq!(hash.to_hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
/// assert!(KeyHash::from_hex(&hash.to_hex()) == Some(hash));
/// assert_eq!(format!("{hash:?}"), "KeyHash(…)");
/// ```
#[derive(Clone, Copy, Eq)]
pub struct KeyHash([u8; 32]);

impl KeyHash {
    /// SHA-256 of `key_text`'s bytes, for any text: a presented key is
    /// hashed and looked up whether or not it is well formed.
    pub fn of(key_text: &str) -> KeyHash {
        KeyHash(Sha256::digest(key_text.as_bytes()).into())
    }

    /// The identity of a key a service's
    /// [`KeyVerifier`](crate::auth::KeyVerifier) names `id`: a SHA-256 kept
    /// apart from every key text's (a NUL, which no presented token holds,
    /// follows a label), so no token taken by its hash, and no `mg-v1-`
    /// key, has the identity of a verified key, and a verifier can name no
    /// key but those imported under this.
    pub fn verified(id: &str) -> KeyHash {
        let mut digest = Sha256::new();
        digest.update(b"modelgate verified key\0");
        digest.update(id.as_bytes());
        KeyHash(digest.finalize().into())
    }

    /// 64 lowercase hex characters: the key's id in the store and the
    /// management API.
    pub fn to_hex(&self) -> String {
        // By a table into a buffer: `hex::encode` goes char by char, and
        // every request names its key's hash.
        let mut digits = [0; 64];
        hex::encode_to_slice(self.0, &mut digits).expect("64 digits for 32 bytes");
        String::from_utf8(digits.to_vec()).expect("hex digits are ASCII")
    }

    /// The hash whose [`to_hex`](KeyHash::to_hex) is `text`: exactly 64
    /// lowercase hex characters. Uppercase is refused so each hash has one
    /// spelling, and ids compared as strings always agree.
    pub fn from_hex(text: &str) -> Option<KeyHash> {
        if text.len() != 64 || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        let mut bytes = [0; 32];
        hex::decode_to_slice(text, &mut bytes).ok()?;
        Some(KeyHash(bytes))
    }

    /// The 32 bytes of the digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl PartialEq for KeyHash {
    fn eq(&self, other: &KeyHash) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

// By hand, not derived, because `PartialEq` is by hand; hashes the same
// bytes that equality compares, so the two agree.
impl Hash for KeyHash {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyHash(…)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    #[test]
    fn a_hint_shows_three_random_characters_and_the_last_four_only() {
        let key = ApiKey::generate();
        let hint = key.hint();
        let text = key.expose();
        assert_eq!(hint, format!("{}…{}", &text[..9], &text[text.len() - 4..]));
        assert!(hint.starts_with(ApiKey::PREFIX));
        // The prefix, 3 + 4 characters and the ellipsis.
        assert_eq!(hint.chars().count(), ApiKey::PREFIX.len() + 3 + 1 + 4);
        assert!(!hint.contains(&text[9..text.len() - 4]));
    }

    const EXAMPLE: &str = "mg-v1-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefg2p0x4C";

    /// A well-formed key with `random` as its random part.
    fn key_with(random: &str) -> String {
        let body = format!("{}{random}", ApiKey::PREFIX);
        let checksum = checksum(body.as_bytes());
        format!("{body}{}", std::str::from_utf8(&checksum).unwrap())
    }

    /// `key` with the character at `at` replaced by a different base62 one,
    /// chosen by `pick`.
    fn substitute(key: &str, at: usize, pick: usize) -> String {
        let current = key.as_bytes()[at];
        let others: Vec<u8> = BASE62.iter().copied().filter(|&c| c != current).collect();
        let mut bytes = key.as_bytes().to_vec();
        bytes[at] = others[pick % others.len()];
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn the_documented_example_and_checksum_rule_agree() {
        // Worked by hand from the module docs, independently of `checksum`.
        let digest = Sha256::digest(&EXAMPLE.as_bytes()[..49]);
        let value = u64::from(u32::from_be_bytes(digest[..4].try_into().unwrap()));
        let decoded = EXAMPLE[49..].bytes().fold(0u64, |acc, c| {
            acc * 62 + BASE62.iter().position(|&d| d == c).unwrap() as u64
        });
        assert_eq!(decoded, value);
        assert!(ApiKey::parse(EXAMPLE).is_ok());
        assert_eq!(key_with(&EXAMPLE[6..49]), EXAMPLE);
    }

    #[test]
    fn the_length_is_55() {
        assert_eq!(ApiKey::LEN, 55);
        assert_eq!(EXAMPLE.len(), ApiKey::LEN);
    }

    #[test]
    fn generated_keys_have_the_documented_shape() {
        for _ in 0..64 {
            let key = ApiKey::generate();
            let text = key.expose();
            assert_eq!(text.len(), ApiKey::LEN);
            assert!(text.starts_with(ApiKey::PREFIX));
            assert!(text[6..].bytes().all(|b| b.is_ascii_alphanumeric()));
            assert!(matches!(text.as_bytes()[49], b'0'..=b'4'));
            assert!(ApiKey::parse(text).is_ok());
        }
    }

    #[test]
    fn generated_keys_differ() {
        let keys: HashSet<String> = (0..100)
            .map(|_| ApiKey::generate().expose().to_owned())
            .collect();
        assert_eq!(keys.len(), 100);
        assert!(ApiKey::generate().hash() != ApiKey::generate().hash());
    }

    #[test]
    fn generated_random_parts_use_the_whole_alphabet() {
        // 100 keys are 4,300 draws; a missing character means a biased draw.
        let seen: HashSet<u8> = (0..100)
            .flat_map(|_| ApiKey::generate().expose().as_bytes()[6..49].to_vec())
            .collect();
        assert_eq!(seen.len(), 62);
    }

    #[test]
    fn parse_rejects_each_fault() {
        let cases = [
            ("", KeyFormatError::WrongPrefix),
            (
                "sk-v1-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefg2p0x4C",
                KeyFormatError::WrongPrefix,
            ),
            (
                "MG-V1-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefg2p0x4C",
                KeyFormatError::WrongPrefix,
            ),
            (
                "mg-v2-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefg2p0x4C",
                KeyFormatError::WrongPrefix,
            ),
            ("mg-v1-", KeyFormatError::WrongLength),
            (
                "mg-v1-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefg2p0x4",
                KeyFormatError::WrongLength,
            ),
            (
                "mg-v1-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefg2p0x4CC",
                KeyFormatError::WrongLength,
            ),
            (
                "mg-v1-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefg2p0x4C\n",
                KeyFormatError::InvalidCharacter,
            ),
            (
                "mg-v1-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdef-2p0x4C",
                KeyFormatError::InvalidCharacter,
            ),
            (
                "mg-v1-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdeé2p0x4C",
                KeyFormatError::InvalidCharacter,
            ),
            (
                "mg-v1-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefg2p0x4D",
                KeyFormatError::BadChecksum,
            ),
            (
                "mg-v1-1123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefg2p0x4C",
                KeyFormatError::BadChecksum,
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(ApiKey::parse(text).unwrap_err(), expected, "{text:?}");
            assert!(!looks_like_key(text), "{text:?}");
            let message = expected.to_string();
            assert!(message.contains("key"), "{message}");
        }
    }

    #[test]
    fn every_single_substitution_of_generated_keys_is_caught() {
        // Every position, every other base62 character. A random-part
        // substitution slips through only on a 32-bit SHA-256 prefix
        // collision: 2 × 43 × 61 tries, so this fails spuriously with odds
        // of about 1 in 800,000 runs.
        for _ in 0..2 {
            let key = ApiKey::generate();
            for at in 0..ApiKey::LEN {
                for pick in 0..61 {
                    let changed = substitute(key.expose(), at, pick);
                    assert!(!looks_like_key(&changed), "{at} {pick}");
                }
            }
        }
    }

    #[test]
    fn key_hash_of_known_text() {
        assert_eq!(
            KeyHash::of("").to_hex(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert!(ApiKey::parse(EXAMPLE).unwrap().hash() == KeyHash::of(EXAMPLE));
    }

    #[test]
    fn from_hex_takes_exactly_64_lowercase_hex_characters() {
        let hex = KeyHash::of(EXAMPLE).to_hex();
        assert!(KeyHash::from_hex(&hex).is_some());
        assert!(KeyHash::from_hex(&hex.to_uppercase()).is_none());
        assert!(KeyHash::from_hex(&hex[..63]).is_none());
        assert!(KeyHash::from_hex(&format!("{hex}0")).is_none());
        assert!(KeyHash::from_hex(&format!("{}g", &hex[..63])).is_none());
        assert!(KeyHash::from_hex(&format!(" {}", &hex[..63])).is_none());
        assert!(KeyHash::from_hex(&format!("{}é", &hex[..62])).is_none());
        assert!(KeyHash::from_hex("").is_none());
    }

    #[test]
    fn key_hashes_compare_and_hash_by_value() {
        let a = KeyHash::of("a");
        assert!(a == KeyHash::of("a"));
        assert!(a != KeyHash::of("b"));
        let set: HashSet<KeyHash> = [a, KeyHash::of("a"), KeyHash::of("b")].into();
        assert_eq!(set.len(), 2);
        assert_eq!(a.as_bytes(), &<[u8; 32]>::from(Sha256::digest(b"a")));
    }

    #[test]
    fn debug_never_shows_the_secret_or_the_hash() {
        let key = ApiKey::parse(EXAMPLE).unwrap();
        assert_eq!(format!("{key:?}"), "ApiKey(mg-v1-…)");
        assert_eq!(format!("{key:#?}"), "ApiKey(mg-v1-…)");
        assert_eq!(format!("{:?}", key.hash()), "KeyHash(…)");
        assert_eq!(
            format!("{:#?}", Some(key.hash())),
            "Some(\n    KeyHash(…),\n)"
        );
    }

    proptest! {
        #[test]
        fn any_random_part_makes_a_key(random in "[0-9A-Za-z]{43}") {
            let text = key_with(&random);
            prop_assert!(looks_like_key(&text));
            let key = ApiKey::parse(&text).unwrap();
            prop_assert_eq!(key.expose(), text.as_str());
        }

        #[test]
        fn generated_keys_parse_and_a_substitution_is_caught(
            at in 0..ApiKey::LEN,
            pick in 0usize..61,
        ) {
            // Caught always in the prefix and checksum; in the random part
            // missed with odds of 1 in 2^32 per case (a 32-bit checksum).
            let key = ApiKey::generate();
            prop_assert!(looks_like_key(key.expose()));
            prop_assert!(ApiKey::parse(key.expose()).is_ok());
            let changed = substitute(key.expose(), at, pick);
            prop_assert_ne!(&changed, key.expose());
            prop_assert!(!looks_like_key(&changed));
            if at < ApiKey::PREFIX.len() {
                prop_assert_eq!(ApiKey::parse(&changed).unwrap_err(), KeyFormatError::WrongPrefix);
            } else {
                prop_assert_eq!(ApiKey::parse(&changed).unwrap_err(), KeyFormatError::BadChecksum);
            }
        }

        #[test]
        fn a_checksum_substitution_is_always_caught(
            random in "[0-9A-Za-z]{43}",
            at in 49..ApiKey::LEN,
            pick in 0usize..61,
        ) {
            // No odds here: distinct 6-digit strings are distinct numbers.
            let changed = substitute(&key_with(&random), at, pick);
            prop_assert_eq!(ApiKey::parse(&changed).unwrap_err(), KeyFormatError::BadChecksum);
        }

        #[test]
        fn arbitrary_text_never_panics(text in any::<String>()) {
            prop_assert_eq!(ApiKey::parse(&text).is_ok(), looks_like_key(&text));
            let _ = KeyHash::of(&text);
        }

        #[test]
        fn key_hash_hex_round_trips(bytes in any::<[u8; 32]>(), text in any::<String>()) {
            let hash = KeyHash(bytes);
            let hex = hash.to_hex();
            prop_assert_eq!(hex.len(), 64);
            prop_assert!(KeyHash::from_hex(&hex) == Some(hash));
            prop_assert_eq!(*KeyHash::from_hex(&hex).unwrap().as_bytes(), bytes);
            let of = KeyHash::of(&text);
            prop_assert!(KeyHash::from_hex(&of.to_hex()) == Some(of));
        }

        #[test]
        fn from_hex_accepts_exactly_lowercase_hex_of_64(
            hex in "[0-9a-f]{64}",
            at in 0usize..64,
            replacement in "[A-Fg-z ]",
            extra in "[0-9a-f]",
        ) {
            prop_assert!(KeyHash::from_hex(&hex).is_some());
            let mut changed = hex.clone();
            changed.replace_range(at..=at, &replacement);
            prop_assert!(KeyHash::from_hex(&changed).is_none());
            prop_assert!(KeyHash::from_hex(&hex[1..]).is_none());
            let longer = hex.clone() + &extra;
            prop_assert!(KeyHash::from_hex(&longer).is_none());
        }

        #[test]
        fn debug_never_contains_the_random_part_or_the_hex(random in "[0-9A-Za-z]{43}") {
            let key = ApiKey::parse(&key_with(&random)).unwrap();
            let debug = format!("{key:?} {:?} {key:#?}", key.hash());
            prop_assert!(!debug.contains(&random[..8]));
            prop_assert!(!debug.contains(&key.hash().to_hex()[..8]));
            prop_assert!(!debug.contains(&key.expose()[49..]));
        }
    }
}
