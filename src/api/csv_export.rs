//! The generations page as CSV (`GET /api/v1/generations?format=csv`),
//! with the `csv` feature.

use serde_json::Value;

use super::answers::ok;
use crate::answer::Answer;
use crate::error::{ErrorKind, GatewayError};
use crate::keys::credits::{decimal_string, nanos_from_json};
use crate::usage::cost_note;

/// The columns of the CSV export, as the records name their fields, but
/// the last: `cost_note`, why the cost is what it is when a person would
/// not guess it ([`cost_note`]).
const CSV_COLUMNS: [&str; 24] = [
    "id",
    "created_at",
    "api",
    "model",
    "requested_model",
    "provider_name",
    "key_hash",
    "tokens_prompt",
    "tokens_completion",
    "native_tokens_cached",
    "native_tokens_cache_write",
    "native_tokens_reasoning",
    "web_search_requests",
    "total_cost",
    "cost_basis",
    "is_byok",
    "streamed",
    "cancelled",
    "status",
    "latency",
    "generation_time",
    "app_id",
    "app_title",
    "cost_note",
];

/// The columns that hold credits: written as plain decimals.
const CSV_CREDIT_COLUMNS: [&str; 1] = ["total_cost"];

/// The records as CSV (RFC 4180): a header, then a row each; a field the
/// record lacks is empty. Credits are plain decimals (`0.00000375`, never
/// `3.75e-6`), exact to the nano-credit. A cell a spreadsheet would read
/// as a formula is quoted behind a `'`, so an app title cannot run one.
pub(super) fn answer(records: &[Value]) -> Result<Answer, GatewayError> {
    // Writing into memory fails only on a bug: then a 500 saying so.
    let failed = |error: csv::Error| {
        GatewayError::new(
            ErrorKind::Internal,
            format!("the CSV export could not be written: {error}"),
        )
    };
    let mut writer = csv::WriterBuilder::new()
        .terminator(csv::Terminator::CRLF)
        .from_writer(Vec::new());
    writer.write_record(CSV_COLUMNS).map_err(failed)?;
    for record in records {
        let cells = CSV_COLUMNS.iter().map(|column| csv_cell(record, column));
        writer.write_record(cells).map_err(failed)?;
    }
    let bytes = writer
        .into_inner()
        .map_err(|error| failed(error.into_error().into()))?;
    let mut answer = ok(Value::Null);
    answer.raw = Some(("text/csv; charset=utf-8", bytes::Bytes::from(bytes)));
    Ok(answer.with_header(
        http::header::CONTENT_DISPOSITION,
        http::HeaderValue::from_static("attachment; filename=\"generations.csv\""),
    ))
}

/// One cell of `record`'s row.
fn csv_cell(record: &Value, column: &str) -> String {
    if column == "cost_note" {
        return cost_note(record).unwrap_or_default().to_owned();
    }
    match &record[column] {
        Value::Null => String::new(),
        Value::String(text) => spreadsheet_safe(text),
        number @ Value::Number(_) if CSV_CREDIT_COLUMNS.contains(&column) => {
            match nanos_from_json(number) {
                Ok(nanos) => decimal_string(nanos, 0),
                Err(_) => number.to_string(),
            }
        }
        other => other.to_string(),
    }
}

/// `text`, with a leading `'` when a spreadsheet would take it for a
/// formula (`=`, `+`, `-`, `@`, a tab or a carriage return first).
fn spreadsheet_safe(text: &str) -> String {
    match text.chars().next() {
        Some('=' | '+' | '-' | '@' | '\t' | '\r') => format!("'{text}"),
        _ => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn csv_credits_are_plain_decimals_and_notes_are_words() {
        let record = json!({
            "id": "gen-1",
            "total_cost": 0.00000375,
            "cost_basis": "usage",
            "tokens_prompt": 12,
            "is_byok": false,
            "app_title": "=HYPERLINK(\"x\")",
        });
        assert_eq!(csv_cell(&record, "total_cost"), "0.00000375");
        assert_eq!(csv_cell(&json!({"total_cost": 12}), "total_cost"), "12");
        assert_eq!(
            csv_cell(&json!({"total_cost": 1e-9}), "total_cost"),
            "0.000000001"
        );
        assert_eq!(csv_cell(&record, "tokens_prompt"), "12");
        assert_eq!(csv_cell(&record, "is_byok"), "false");
        assert_eq!(csv_cell(&record, "app_title"), "'=HYPERLINK(\"x\")");
        assert_eq!(csv_cell(&record, "model"), "");
        assert_eq!(csv_cell(&record, "cost_note"), "");
        let lapsed = json!({"total_cost": 0.134, "cost_basis": "lapsed", "lapsed": true});
        assert!(csv_cell(&lapsed, "cost_note").starts_with("charged its whole hold"));
        let unanswered = json!({"total_cost": 0.134, "cost_basis": "unanswered"});
        assert!(csv_cell(&unanswered, "cost_note").contains("never answered"));
    }
}
