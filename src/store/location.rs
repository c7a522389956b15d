//! Where a gateway keeps its state, as one string names it (the proxy's
//! `--store`).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Where a gateway keeps its state: `memory` (lost when the process
/// stops), `sqlite:PATH` (one file on this machine, [`SqliteStore`](super::SqliteStore))
/// or a Redis URL, `redis://…` or `rediss://…` ([`RedisStore`](super::RedisStore)).
///
/// ```
/// use modelgate::store::StoreLocation;
///
/// let location: StoreLocation = "sqlite:state/modelgate.db".parse().unwrap();
/// assert_eq!(location, StoreLocation::Sqlite("state/modelgate.db".into()));
/// assert!("postgres://db".parse::<StoreLocation>().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreLocation {
    /// In process memory.
    Memory,
    /// A SQLite file at this path.
    Sqlite(PathBuf),
    /// Redis or Redis Cluster at this URL.
    Redis(String),
}

/// Why a store location was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "a store is `memory`, `sqlite:PATH` or a Redis URL (`redis://…`, `rediss://…`), not {given:?}"
)]
pub struct InvalidStoreLocation {
    given: String,
}

/// The longest location accepted: a path or URL, never a document.
const MAX_LOCATION_BYTES: usize = 4096;

impl FromStr for StoreLocation {
    type Err = InvalidStoreLocation;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidStoreLocation {
            given: text.chars().take(64).collect(),
        };
        if text.len() > MAX_LOCATION_BYTES || text.chars().any(char::is_control) {
            return Err(invalid());
        }
        if text == "memory" {
            return Ok(StoreLocation::Memory);
        }
        if let Some(path) = text.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(invalid());
            }
            return Ok(StoreLocation::Sqlite(PathBuf::from(path)));
        }
        if text.len() > "rediss://".len()
            && (text.starts_with("redis://") || text.starts_with("rediss://"))
        {
            return Ok(StoreLocation::Redis(text.to_owned()));
        }
        Err(invalid())
    }
}

impl fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreLocation::Memory => f.write_str("memory"),
            StoreLocation::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            StoreLocation::Redis(url) => f.write_str(url),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn each_kind_is_named_as_documented() {
        assert_eq!("memory".parse(), Ok(StoreLocation::Memory));
        assert_eq!(
            "sqlite:modelgate.db".parse(),
            Ok(StoreLocation::Sqlite("modelgate.db".into()))
        );
        assert_eq!(
            "sqlite:/var/lib/gw/state.db".parse(),
            Ok(StoreLocation::Sqlite("/var/lib/gw/state.db".into()))
        );
        assert_eq!(
            "redis://127.0.0.1:6379".parse(),
            Ok(StoreLocation::Redis("redis://127.0.0.1:6379".into()))
        );
        assert_eq!(
            "rediss://cache.example:6380/0".parse(),
            Ok(StoreLocation::Redis("rediss://cache.example:6380/0".into()))
        );
    }

    #[test]
    fn anything_else_is_refused_with_what_was_given() {
        for text in [
            "",
            "Memory",
            "sqlite:",
            "sqlite",
            "redis://",
            "rediss://",
            "http://redis",
            "modelgate.db",
            "sqlite:a\nb",
        ] {
            let error = text.parse::<StoreLocation>().unwrap_err();
            assert!(error.to_string().contains("sqlite:PATH"), "{text:?}");
        }
        let long = format!("sqlite:{}", "a".repeat(5000));
        assert!(long.parse::<StoreLocation>().is_err());
    }

    proptest! {
        #[test]
        fn parsing_never_panics_and_what_parses_prints_back(text in ".{0,80}") {
            if let Ok(location) = text.parse::<StoreLocation>() {
                prop_assert_eq!(location.to_string(), text.clone());
                prop_assert_eq!(text.parse::<StoreLocation>(), Ok(location));
            }
        }

        #[test]
        fn every_sqlite_path_is_taken_as_given(path in "[a-zA-Z0-9_./ -]{1,60}") {
            prop_assert_eq!(
                format!("sqlite:{path}").parse::<StoreLocation>(),
                Ok(StoreLocation::Sqlite(PathBuf::from(&path)))
            );
        }
    }
}
