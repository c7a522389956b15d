//! [`JsonObject`]: a JSON object edited at its top level only.

use serde_json::value::RawValue;

/// A JSON object edited at its top level only: the members it leaves
/// alone, and the bytes between them, are copied from the text as they
/// were, so a message's or a completion's text is never rebuilt.
#[derive(Debug)]
pub(crate) struct JsonObject<'a> {
    text: &'a [u8],
    members: Vec<Member<'a>>,
    // Where a member goes in an object that has none: just after `{`.
    open_end: usize,
    added: Vec<(String, String)>,
}

#[derive(Debug)]
struct Member<'a> {
    name: std::borrow::Cow<'a, str>,
    key_start: usize,
    value: &'a str,
    value_end: usize,
    edit: Option<MemberEdit>,
}

#[derive(Debug)]
enum MemberEdit {
    Replace(String),
    Remove,
}

#[cfg(test)]
thread_local! {
    /// How many times this thread has parsed an object: what shows a
    /// reader parses each chunk once.
    pub(crate) static PARSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A top-level name that appears more than once: which one an edit means
/// is unclear (and the next reader may take the other), so it is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Repeated;

impl<'a> JsonObject<'a> {
    /// `text` read as one JSON object (whitespace around it allowed);
    /// `None` when it is anything else.
    pub(crate) fn parse(text: &'a [u8]) -> Option<JsonObject<'a>> {
        #[cfg(test)]
        PARSES.with(|parses| parses.set(parses.get() + 1));
        let RawMembers(raw) = crate::body::json_from_bytes(text).ok()?;
        // The raw values are slices of `text`: their place in it, without
        // `unsafe`, is the distance between the two addresses.
        let offset = |part: &str| (part.as_ptr() as usize).checked_sub(text.as_ptr() as usize);
        let open = text.iter().position(|&byte| byte == b'{')?;
        let mut members = Vec::with_capacity(raw.len());
        for (key, value) in raw {
            let key = key.get();
            let value = value.get();
            let key_start = offset(key)?;
            let value_end = offset(value)?.checked_add(value.len())?;
            // In order and inside `text`, as serde_json reads them: checked
            // so that `to_bytes` can slice without a doubt.
            let after_previous = members
                .last()
                .map_or(open < key_start, |previous: &Member<'_>| {
                    previous.value_end <= key_start
                });
            if !after_previous || key_start + key.len() > value_end || value_end > text.len() {
                return None;
            }
            let quoted = key.strip_prefix('"')?.strip_suffix('"')?;
            let name = if quoted.contains('\\') {
                std::borrow::Cow::Owned(serde_json::from_str::<String>(key).ok()?)
            } else {
                std::borrow::Cow::Borrowed(quoted)
            };
            members.push(Member {
                name,
                key_start,
                value,
                value_end,
                edit: None,
            });
        }
        Some(JsonObject {
            text,
            members,
            open_end: open + 1,
            added: Vec::new(),
        })
    }

    fn find(&self, name: &str) -> Result<Option<usize>, Repeated> {
        let mut found = None;
        for (index, member) in self.members.iter().enumerate() {
            if member.name == name {
                if found.is_some() {
                    return Err(Repeated);
                }
                found = Some(index);
            }
        }
        Ok(found)
    }

    /// The JSON text of member `name` as the object was read (edits not
    /// applied); `None` when it has no such member.
    pub(crate) fn get(&self, name: &str) -> Result<Option<&'a str>, Repeated> {
        Ok(self.find(name)?.map(|index| self.members[index].value))
    }

    /// Sets member `name` to `json` (JSON text, which the caller vouches
    /// for): in its place when the object has it, else last.
    pub(crate) fn set(&mut self, name: &str, json: String) -> Result<(), Repeated> {
        match self.find(name)? {
            Some(index) => self.members[index].edit = Some(MemberEdit::Replace(json)),
            None => match self.added.iter_mut().find(|(added, _)| added == name) {
                Some(added) => added.1 = json,
                None => self.added.push((name.to_owned(), json)),
            },
        }
        Ok(())
    }

    /// Removes member `name`, when the object has it.
    pub(crate) fn remove(&mut self, name: &str) -> Result<(), Repeated> {
        if let Some(index) = self.find(name)? {
            self.members[index].edit = Some(MemberEdit::Remove);
        }
        self.added.retain(|(added, _)| added != name);
        Ok(())
    }

    /// The object's text with the edits made.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let text = self.text;
        let extra: usize = self
            .added
            .iter()
            .map(|(name, json)| name.len() + json.len() + 8)
            .sum();
        let mut out = Vec::with_capacity(text.len() + extra);
        // Up to the first member (or the `{` of an empty object), and from
        // the end of the last one: `}` and any whitespace, as they were.
        let (head_end, tail_start) = match (self.members.first(), self.members.last()) {
            (Some(first), Some(last)) => (first.key_start, last.value_end),
            _ => (self.open_end, self.open_end),
        };
        out.extend_from_slice(&text[..head_end]);
        let mut wrote_any = false;
        let mut previous_end = head_end;
        for member in &self.members {
            let separator = &text[previous_end..member.key_start];
            previous_end = member.value_end;
            let value_start = member.value_end - member.value.len();
            let value = match &member.edit {
                Some(MemberEdit::Remove) => continue,
                Some(MemberEdit::Replace(json)) => json.as_bytes(),
                None => member.value.as_bytes(),
            };
            // A kept member keeps the separator (comma and whitespace) that
            // stood before it, unless everything before it was removed.
            if wrote_any {
                out.extend_from_slice(separator);
            }
            out.extend_from_slice(&text[member.key_start..value_start]);
            out.extend_from_slice(value);
            wrote_any = true;
        }
        for (name, json) in &self.added {
            if wrote_any {
                out.push(b',');
            }
            // A `String` always serialises.
            out.extend_from_slice(serde_json::to_string(name).unwrap_or_default().as_bytes());
            out.push(b':');
            out.extend_from_slice(json.as_bytes());
            wrote_any = true;
        }
        out.extend_from_slice(&text[tail_start..]);
        out
    }
}

/// A JSON object's top-level members in order, names and values unparsed.
struct RawMembers<'a>(Vec<(&'a RawValue, &'a RawValue)>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for RawMembers<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor<'a>(std::marker::PhantomData<&'a ()>);

        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visitor<'a> {
            type Value = RawMembers<'a>;

            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<RawMembers<'a>, A::Error> {
                let mut members = Vec::new();
                while let Some(name) = map.next_key()? {
                    members.push((name, map.next_value()?));
                }
                Ok(RawMembers(members))
            }
        }

        deserializer.deserialize_map(Visitor(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn edited(text: &str, edit: impl FnOnce(&mut JsonObject<'_>)) -> String {
        let mut object = JsonObject::parse(text.as_bytes()).unwrap();
        edit(&mut object);
        String::from_utf8(object.to_bytes()).unwrap()
    }

    #[test]
    fn a_json_object_edit_keeps_every_other_byte() {
        let text = " { \"a\" : 1.50 ,\n \"b\":[ 1,2 ], \"c\" :\"\\u00e9\" } \n";
        assert_eq!(edited(text, |_| {}), text);
        assert_eq!(
            edited(text, |o| o.set("b", "true".into()).unwrap()),
            " { \"a\" : 1.50 ,\n \"b\":true, \"c\" :\"\\u00e9\" } \n"
        );
        assert_eq!(
            edited(text, |o| o.remove("a").unwrap()),
            " { \"b\":[ 1,2 ], \"c\" :\"\\u00e9\" } \n"
        );
        assert_eq!(
            edited(text, |o| o.remove("b").unwrap()),
            " { \"a\" : 1.50, \"c\" :\"\\u00e9\" } \n"
        );
        assert_eq!(
            edited(text, |o| o.remove("c").unwrap()),
            " { \"a\" : 1.50 ,\n \"b\":[ 1,2 ] } \n"
        );
        assert_eq!(
            edited(text, |o| {
                o.remove("a").unwrap();
                o.remove("c").unwrap();
                o.set("d", "{}".into()).unwrap();
            }),
            " { \"b\":[ 1,2 ],\"d\":{} } \n"
        );
        assert_eq!(
            edited(text, |o| ["a", "b", "c"]
                .iter()
                .for_each(|n| o.remove(n).unwrap())),
            " {  } \n"
        );
        assert_eq!(
            edited("{}", |o| o.set("x", "1".into()).unwrap()),
            "{\"x\":1}"
        );
        assert_eq!(
            edited("{ }", |o| o.set("x", "1".into()).unwrap()),
            "{\"x\":1 }"
        );
        assert_eq!(edited("{}", |o| o.remove("x").unwrap()), "{}");
    }

    #[test]
    fn a_json_object_knows_escaped_names_and_refuses_repeated_ones() {
        let text = r#"{"\u006dodel":"a","m\"q":1}"#;
        let object = JsonObject::parse(text.as_bytes()).unwrap();
        assert_eq!(object.get("model"), Ok(Some("\"a\"")));
        assert_eq!(object.get("m\"q"), Ok(Some("1")));
        assert_eq!(object.get("other"), Ok(None));
        // The name's own bytes stay as they were spelled.
        assert_eq!(
            edited(text, |o| o.set("model", "\"b\"".into()).unwrap()),
            r#"{"\u006dodel":"b","m\"q":1}"#
        );
        let mut repeated = JsonObject::parse(br#"{"a":1,"b":2,"a":3}"#).unwrap();
        assert_eq!(repeated.get("a"), Err(Repeated));
        assert_eq!(repeated.set("a", "0".into()), Err(Repeated));
        assert_eq!(repeated.remove("a"), Err(Repeated));
        assert_eq!(repeated.get("b"), Ok(Some("2")));
        for not_an_object in [&b"[1]"[..], b"", b"{", b"{\"a\":1}x", b"null", b"\"{}\""] {
            assert!(JsonObject::parse(not_an_object).is_none());
        }
    }

    proptest! {
        #[test]
        fn an_unedited_json_object_comes_back_byte_for_byte(
            members in proptest::collection::vec(("[a-z\\\\\"]{0,4}", "-?[1-9][0-9]{0,2}|0|\"[a-z ]{0,5}\"|\\[\\]|\\{\\}|null|true"), 0..6),
            spaces in proptest::collection::vec("[ \t\r\n]{0,2}", 32),
            removed in 0usize..8,
        ) {
            let mut text = format!("{}{{", spaces[0]);
            for (index, (name, value)) in members.iter().enumerate() {
                if index > 0 {
                    text.push_str(&format!("{},", spaces[4 * index]));
                }
                let name = serde_json::to_string(name).unwrap();
                text.push_str(&format!("{}{name}{}:{}{value}", spaces[4 * index + 1], spaces[4 * index + 2], spaces[4 * index + 3]));
            }
            text.push_str(&format!("{}}}{}", spaces[30], spaces[31]));
            let object = JsonObject::parse(text.as_bytes()).unwrap();
            prop_assert_eq!(object.to_bytes(), text.as_bytes());
            // Removing one member leaves valid JSON with the others as they were.
            if let Some((name, _)) = members.get(removed) {
                let mut object = JsonObject::parse(text.as_bytes()).unwrap();
                if object.remove(name).is_ok() {
                    let out = object.to_bytes();
                    let before: serde_json::Map<String, Value> = serde_json::from_str(&text).unwrap();
                    let mut after: serde_json::Map<String, Value> = serde_json::from_slice(&out).unwrap();
                    let mut expected = before.clone();
                    expected.remove(name);
                    after.sort_keys();
                    expected.sort_keys();
                    prop_assert_eq!(after, expected);
                }
            }
        }

    }
}
