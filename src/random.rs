//! Random bytes from the operating system's CSPRNG (`getrandom`), for
//! keys, codes, secrets and ids: one source, no user-space generator to
//! seed or to build.

/// The characters of [`alphanumeric`]: ASCII letters and digits.
const ALPHANUMERIC: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// Fills `bytes` from the operating system. Its failure (no entropy source
/// at all) is a broken host, where no key may be made: a panic.
pub(crate) fn fill(bytes: &mut [u8]) {
    getrandom::fill(bytes).expect("the operating system gives random bytes");
}

/// `N` random bytes.
pub(crate) fn bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0; N];
    fill(&mut bytes);
    bytes
}

/// A random `u128`.
pub(crate) fn u128() -> u128 {
    u128::from_ne_bytes(bytes())
}

/// A random fraction in `[0, 1)`, 53 bits of it.
#[cfg(feature = "proxy")]
pub(crate) fn fraction() -> f64 {
    (u64::from_ne_bytes(bytes()) >> 11) as f64 / (1u64 << 53) as f64
}

/// `len` characters drawn uniformly from ASCII letters and digits: each
/// random byte's top six bits pick one of 64, and the two past 61 are
/// drawn again, so no character is likelier than another.
pub(crate) fn alphanumeric(len: usize) -> String {
    let mut text = String::with_capacity(len);
    let mut pool = [0u8; 64];
    while text.len() < len {
        fill(&mut pool);
        for byte in pool {
            let index = usize::from(byte >> 2);
            if let Some(&character) = ALPHANUMERIC.get(index) {
                text.push(char::from(character));
                if text.len() == len {
                    break;
                }
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphanumeric_text_has_its_length_and_every_character() {
        let text = alphanumeric(20_000);
        assert_eq!(text.len(), 20_000);
        assert!(text.bytes().all(|byte| byte.is_ascii_alphanumeric()));
        for &character in ALPHANUMERIC {
            // Each of 62 is expected about 323 times.
            let seen = text.bytes().filter(|&byte| byte == character).count();
            assert!(
                (150..600).contains(&seen),
                "{} seen {seen} times",
                char::from(character)
            );
        }
        assert_ne!(alphanumeric(43), alphanumeric(43));
    }

    #[cfg(feature = "proxy")]
    #[test]
    fn fractions_stay_below_one() {
        for _ in 0..1000 {
            let fraction = fraction();
            assert!((0.0..1.0).contains(&fraction));
        }
        assert_ne!(u128(), u128());
    }
}
