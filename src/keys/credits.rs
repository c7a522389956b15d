//! Credits on the wire: JSON numbers and decimal strings in, nano-credits
//! (`i64`) inside. Storage never sees a float.

use serde_json::{Number, Value};

use crate::store::NANOS_PER_CREDIT;

/// The largest amount a request may name: keeps every sum of a few such
/// amounts far from `i64` overflow (about 9.2 × 10⁹ credits in total).
pub const MAX_CREDITS: i64 = 1_000_000_000;

/// Why a JSON value is not an amount of credits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AmountError {
    NotANumber,
    Negative,
    TooLarge,
}

impl AmountError {
    /// Words for an error message, after the field's name.
    pub(crate) fn describe(self) -> String {
        match self {
            AmountError::NotANumber => "must be a number of credits".to_owned(),
            AmountError::Negative => "must not be negative".to_owned(),
            AmountError::TooLarge => format!("must be at most {MAX_CREDITS} credits"),
        }
    }
}

/// A JSON number of credits as nano-credits, rounded to the nearest nano.
pub(crate) fn nanos_from_json(value: &Value) -> Result<i64, AmountError> {
    let Value::Number(number) = value else {
        return Err(AmountError::NotANumber);
    };
    nanos_from_number(number)
}

fn nanos_from_number(number: &Number) -> Result<i64, AmountError> {
    if let Some(whole) = number.as_i64() {
        if whole < 0 {
            return Err(AmountError::Negative);
        }
        if whole > MAX_CREDITS {
            return Err(AmountError::TooLarge);
        }
        return Ok(whole * NANOS_PER_CREDIT);
    }
    if number.is_u64() {
        return Err(AmountError::TooLarge);
    }
    let credits = number.as_f64().ok_or(AmountError::NotANumber)?;
    // `-0.0` is zero, not negative.
    if credits < 0.0 {
        return Err(AmountError::Negative);
    }
    if !credits.is_finite() || credits > MAX_CREDITS as f64 {
        return Err(AmountError::TooLarge);
    }
    // Within MAX_CREDITS the product stays below 2^60, so the cast is exact
    // to the rounding of the float itself.
    Ok((credits * NANOS_PER_CREDIT as f64).round() as i64)
}

/// Why a decimal text is not an amount of credits: see [`nanos_from_credits`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "an amount of credits is a decimal such as \"12.5\", not negative, with at most 9 decimals and at most {MAX_CREDITS} credits; got {given:?}"
)]
pub struct InvalidCredits {
    given: String,
}

/// Credits written as a decimal (`"10"`, `"0.25"`, `"0.000000001"`) as the
/// nano-credits the Rust API takes (key limits, top-ups, prices), exactly:
/// no float on the way. JSON shows the same amounts as numbers of credits.
///
/// ```
/// use modelgate::keys::{credits_from_nanos, nanos_from_credits};
/// use modelgate::store::NANOS_PER_CREDIT;
///
/// assert_eq!(nanos_from_credits("10").unwrap(), 10 * NANOS_PER_CREDIT);
/// assert_eq!(nanos_from_credits("0.25").unwrap(), 250_000_000);
/// assert_eq!(credits_from_nanos(250_000_000), "0.25");
/// assert!(nanos_from_credits("0.0000000001").is_err()); // below one nano-credit
/// assert!(nanos_from_credits("-1").is_err());
/// ```
pub fn nanos_from_credits(text: &str) -> Result<i64, InvalidCredits> {
    let invalid = || InvalidCredits {
        given: text.chars().take(40).collect(),
    };
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |part: &str| part.bytes().all(|byte| byte.is_ascii_digit());
    if whole.is_empty()
        || whole.len() > 10
        || fraction.len() > 9
        || !digits(whole)
        || !digits(fraction)
        || (text.contains('.') && fraction.is_empty())
    {
        return Err(invalid());
    }
    let whole: i64 = whole.parse().map_err(|_| invalid())?;
    let mut nanos_part = 0i64;
    for (place, digit) in fraction.bytes().enumerate() {
        nanos_part += i64::from(digit - b'0') * 10i64.pow(8 - place as u32);
    }
    if whole > MAX_CREDITS || (whole == MAX_CREDITS && nanos_part > 0) {
        return Err(invalid());
    }
    Ok(whole * NANOS_PER_CREDIT + nanos_part)
}

/// Nano-credits as an exact decimal of credits (`"12.5"`, `"0"`,
/// `"-0.000000001"`): what JSON shows for the amount.
pub fn credits_from_nanos(nanos: i64) -> String {
    decimal_string(nanos, 0)
}

/// Nano-credits as a JSON number of credits (`12.5`, `0`).
pub(crate) fn nanos_to_json(nanos: i64) -> Value {
    if nanos % NANOS_PER_CREDIT == 0 {
        return Value::from(nanos / NANOS_PER_CREDIT);
    }
    // Below 2^53 both operands are exact doubles, and IEEE division rounds
    // the exact quotient to the nearest double: the float parsing the
    // exact decimal text gives, without writing it.
    const EXACT_BELOW: u64 = 1 << 53;
    if nanos.unsigned_abs() < EXACT_BELOW {
        return Value::from(nanos as f64 / NANOS_PER_CREDIT as f64);
    }
    // The decimal text is exact; parsing it gives the nearest float, which
    // prints back as that text when it has few enough digits.
    let credits: f64 = decimal_string(nanos, 0)
        .parse()
        .expect("a decimal string always parses as f64");
    Value::from(credits)
}

/// Nano-credits as an exact decimal string with at least `min_decimals`
/// decimals and no trailing zeros beyond them: `"110.00"`, `"0.000000001"`,
/// `"-1.50"`.
pub(crate) fn decimal_string(nanos: i64, min_decimals: usize) -> String {
    let sign = if nanos < 0 { "-" } else { "" };
    let magnitude = nanos.unsigned_abs();
    let per_credit = NANOS_PER_CREDIT as u64;
    let whole = magnitude / per_credit;
    // The nine decimals, zero-padded, written without the formatter.
    let mut fraction = [b'0'; 9];
    let mut rest = magnitude % per_credit;
    for digit in fraction.iter_mut().rev() {
        *digit = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    let trimmed = fraction
        .iter()
        .rposition(|&digit| digit != b'0')
        .map_or(0, |at| at + 1);
    let significant = trimmed.max(min_decimals).min(9);
    let mut text = String::with_capacity(32);
    text.push_str(sign);
    text.push_str(itoa::Buffer::new().format(whole));
    if significant > 0 {
        text.push('.');
        // ASCII digits only.
        text.push_str(std::str::from_utf8(&fraction[..significant]).unwrap_or_default());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn decimal_credits_are_exact_nanos() {
        assert_eq!(nanos_from_credits("0"), Ok(0));
        assert_eq!(nanos_from_credits("1.5"), Ok(1_500_000_000));
        assert_eq!(nanos_from_credits("0.000000001"), Ok(1));
        assert_eq!(
            nanos_from_credits("1000000000"),
            Ok(MAX_CREDITS * NANOS_PER_CREDIT)
        );
        for bad in [
            "",
            ".5",
            "5.",
            "-1",
            "+1",
            "1e3",
            " 1",
            "1,5",
            "1.0000000001",
            "1000000000.1",
            "99999999999",
        ] {
            assert!(nanos_from_credits(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        /// The division gives the float the exact decimal text parses to,
        /// for any amount, near 2^53 and at the ends of i64 too.
        #[test]
        fn a_json_amount_is_the_float_its_decimal_text_parses_to(
            nanos in prop_oneof![any::<i64>(), -(1i64 << 54)..(1i64 << 54), -100_000i64..100_000],
        ) {
            let parsed: f64 = decimal_string(nanos, 0).parse().unwrap();
            let json = nanos_to_json(nanos);
            match json.as_i64() {
                Some(whole) => prop_assert_eq!(whole * NANOS_PER_CREDIT, nanos),
                None => prop_assert_eq!(json.as_f64().unwrap().to_bits(), parsed.to_bits(), "{}", nanos),
            }
        }
    }

    proptest! {
        #[test]
        fn credits_round_trip_through_their_decimal(nanos in 0..=MAX_CREDITS * NANOS_PER_CREDIT) {
            prop_assert_eq!(nanos_from_credits(&credits_from_nanos(nanos)), Ok(nanos));
        }

        #[test]
        fn any_text_is_an_amount_or_refused(text in "\\PC{0,24}") {
            if let Ok(nanos) = nanos_from_credits(&text) {
                prop_assert!((0..=MAX_CREDITS * NANOS_PER_CREDIT).contains(&nanos));
            }
        }
    }

    #[test]
    fn amounts_convert_to_exact_nanos() {
        assert_eq!(nanos_from_json(&json!(10)), Ok(10 * NANOS_PER_CREDIT));
        assert_eq!(nanos_from_json(&json!(0.1)), Ok(100_000_000));
        assert_eq!(nanos_from_json(&json!(12.5)), Ok(12_500_000_000));
        assert_eq!(nanos_from_json(&json!(0.000000001)), Ok(1));
        assert_eq!(nanos_from_json(&json!(-0.0)), Ok(0));
        assert_eq!(nanos_from_json(&json!(-1)), Err(AmountError::Negative));
        assert_eq!(nanos_from_json(&json!(-0.5)), Err(AmountError::Negative));
        assert_eq!(nanos_from_json(&json!(1e300)), Err(AmountError::TooLarge));
        assert_eq!(
            nanos_from_json(&json!(u64::MAX)),
            Err(AmountError::TooLarge)
        );
        assert_eq!(
            nanos_from_json(&json!(MAX_CREDITS + 1)),
            Err(AmountError::TooLarge)
        );
        assert_eq!(nanos_from_json(&json!("10")), Err(AmountError::NotANumber));
        assert_eq!(nanos_from_json(&json!(null)), Err(AmountError::NotANumber));
    }

    #[test]
    fn decimal_strings_are_exact() {
        assert_eq!(decimal_string(110 * NANOS_PER_CREDIT, 2), "110.00");
        assert_eq!(decimal_string(1, 2), "0.000000001");
        assert_eq!(decimal_string(-1_500_000_000, 2), "-1.50");
        assert_eq!(decimal_string(0, 0), "0");
        assert_eq!(decimal_string(i64::MIN, 2), "-9223372036.854775808");
    }

    #[test]
    fn json_numbers_read_as_people_expect() {
        assert_eq!(nanos_to_json(10 * NANOS_PER_CREDIT).to_string(), "10");
        assert_eq!(nanos_to_json(12_500_000_000).to_string(), "12.5");
        assert_eq!(nanos_to_json(100_000_000).to_string(), "0.1");
        assert_eq!(nanos_to_json(-250_000_000).to_string(), "-0.25");
    }

    proptest! {
        #[test]
        fn nanos_survive_the_round_trip_through_json(nanos in 0..=MAX_CREDITS * NANOS_PER_CREDIT / 1000) {
            // Below 2^53 nanos a float holds every nano, so the round trip is exact.
            let text = nanos_to_json(nanos).to_string();
            let back: Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(nanos_from_json(&back), Ok(nanos));
        }

        #[test]
        fn any_json_number_is_a_result_never_a_panic(value in any::<f64>()) {
            if let Some(number) = Number::from_f64(value) {
                let _ = nanos_from_number(&number);
            }
        }

        #[test]
        fn decimal_strings_parse_back_to_the_same_nanos(nanos in any::<i64>()) {
            let text = decimal_string(nanos, 2);
            let (whole, fraction) = text.trim_start_matches('-').split_once('.').unwrap();
            let fraction = format!("{fraction:0<9}");
            let magnitude = whole.parse::<u128>().unwrap() * 1_000_000_000 + fraction.parse::<u128>().unwrap();
            prop_assert_eq!(magnitude, u128::from(nanos.unsigned_abs()));
            prop_assert_eq!(text.starts_with('-'), nanos < 0);
        }
    }
}
