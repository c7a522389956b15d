//! Numbers as header values, the common ones without an allocation.

use std::sync::OnceLock;

use http::HeaderValue;

/// Numbers below this have their value made once and shared: rate-limit
/// counts, seconds and most bodies' lengths.
const SHARED_BELOW: usize = 1024;

/// `number` as a header value (its decimal digits). One below
/// [`SHARED_BELOW`] is a copy of a value made once, which costs no
/// allocation; every response carries a few such numbers.
pub(crate) fn header_number(number: u64) -> HeaderValue {
    match usize::try_from(number) {
        Ok(index) if index < SHARED_BELOW => SHARED.get_or_init(shared_values)[index].clone(),
        _ => HeaderValue::from(number),
    }
}

static SHARED: OnceLock<Box<[HeaderValue]>> = OnceLock::new();

fn shared_values() -> Box<[HeaderValue]> {
    // The digits of every shared number in one text, kept for the
    // process's life (about 3 KB, once): a value borrowing static text is
    // copied without touching a reference count.
    let mut digits = itoa::Buffer::new();
    let mut text = String::new();
    let mut ends = Vec::with_capacity(SHARED_BELOW);
    for number in 0..SHARED_BELOW {
        text.push_str(digits.format(number));
        ends.push(text.len());
    }
    let text: &'static str = Box::leak(text.into_boxed_str());
    let mut start = 0;
    ends.into_iter()
        .map(|end| {
            let value = HeaderValue::from_static(&text[start..end]);
            start = end;
            value
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn shared_and_made_numbers_read_as_their_digits() {
        for number in [0u64, 1, 9, 10, 99, 1023, 1024, 65_535, u64::MAX] {
            assert_eq!(header_number(number), number.to_string().as_str());
        }
    }

    proptest! {
        #[test]
        fn every_number_is_its_decimal_text(number in any::<u64>(), small in 0u64..2048) {
            for number in [number, small] {
                let digits = number.to_string();
                prop_assert_eq!(header_number(number), digits.as_str());
            }
        }
    }
}
