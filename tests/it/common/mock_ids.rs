//! The mock upstream's answer ids, which differ from answer to answer.

#![allow(dead_code)]

/// The mock's answer ids (`chatcmpl-mock-` and 24 hex digits) in `bytes`.
pub fn mock_ids(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    text.match_indices("chatcmpl-mock-")
        .map(|(at, prefix)| text[at..at + prefix.len() + 24].to_owned())
        .collect()
}

/// `bytes` with each of the mock's answer ids written as `ID`, to compare
/// two answers byte for byte but for their ids.
pub fn without_ids(bytes: &[u8]) -> String {
    let mut text = String::from_utf8_lossy(bytes).into_owned();
    for id in mock_ids(bytes) {
        text = text.replace(&id, "ID");
    }
    text
}
