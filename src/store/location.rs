//! Where a gateway keeps its state, as one string names it (the proxy's
//! `--store`), and the store opened there.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use super::{SharedStore, StoreError};

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
///
/// [`open`](Self::open) opens the store there, as the proxy does:
///
/// ```
/// use modelgate::keys::KeyDirectory;
/// use modelgate::store::StoreLocation;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let location: StoreLocation = std::env::var("STORE")
///     .unwrap_or_else(|_| "memory".to_owned())
///     .parse()?;
/// let directory = KeyDirectory::new(location.open().await?);
/// # let _ = directory;
/// # Ok(()) }
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

/// How [`StoreLocation::open_with`] opens a store: each backend's own
/// configuration, used when the location names that backend. Made with
/// `Default` and changed field by field.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct OpenOptions {
    /// For `sqlite:PATH`.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub sqlite: super::SqliteStoreConfig,
    /// For a Redis URL; its `check_layout` refuses a Redis an older or a
    /// newer version wrote (leave it on but for a migration).
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub redis: super::RedisStoreConfig,
}

/// Why [`StoreLocation::open`] could not open a store. Its message names
/// the location (a Redis URL without its password).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenStoreError {
    /// The location names a backend this build was made without.
    #[error(
        "the store {location} needs modelgate's `{feature}` cargo feature, which this build was made without"
    )]
    FeatureOff {
        /// The location, as shown.
        location: String,
        /// The feature that brings its backend: `sqlite` or `redis`.
        feature: &'static str,
    },
    /// The backend refused or failed: a file it cannot open, a Redis it
    /// cannot reach, data in another version's layout.
    #[error("cannot use the store {location}: {source}")]
    Store {
        /// The location, as shown.
        location: String,
        /// What the backend said.
        source: StoreError,
    },
}

impl StoreLocation {
    /// Opens the store this location names, each backend with its default
    /// configuration: [`open_with`](Self::open_with).
    pub async fn open(&self) -> Result<SharedStore, OpenStoreError> {
        self.open_with(&OpenOptions::default()).await
    }

    /// Opens the store this location names: a new
    /// [`MemoryStore`](super::MemoryStore); the SQLite file (created when
    /// absent, an older schema migrated, a newer one refused); or Redis,
    /// connected and its data's layout checked as `options.redis` says. A
    /// backend whose cargo feature is off is
    /// [`OpenStoreError::FeatureOff`], naming the feature.
    pub async fn open_with(&self, options: &OpenOptions) -> Result<SharedStore, OpenStoreError> {
        let _ = options;
        match self {
            StoreLocation::Memory => Ok(std::sync::Arc::new(super::MemoryStore::new())),
            #[cfg(feature = "sqlite")]
            StoreLocation::Sqlite(path) => super::SqliteStore::open(path, options.sqlite.clone())
                .map(|store| std::sync::Arc::new(store) as SharedStore)
                .map_err(|source| self.failed(source)),
            #[cfg(not(feature = "sqlite"))]
            StoreLocation::Sqlite(_) => Err(self.feature_off("sqlite")),
            #[cfg(feature = "redis")]
            StoreLocation::Redis(url) => super::RedisStore::connect(url, options.redis.clone())
                .await
                .map(|store| std::sync::Arc::new(store) as SharedStore)
                .map_err(|source| self.failed(source)),
            #[cfg(not(feature = "redis"))]
            StoreLocation::Redis(_) => Err(self.feature_off("redis")),
        }
    }

    /// The location as an error shows it: a Redis URL's user and password
    /// cut, since errors go to logs.
    fn shown(&self) -> String {
        match self {
            StoreLocation::Redis(url) => {
                let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url));
                match rest.rsplit_once('@') {
                    Some((_, host)) => format!("{scheme}://…@{host}"),
                    None => url.clone(),
                }
            }
            other => other.to_string(),
        }
    }

    #[cfg(any(feature = "sqlite", feature = "redis"))]
    fn failed(&self, source: StoreError) -> OpenStoreError {
        OpenStoreError::Store {
            location: self.shown(),
            source,
        }
    }

    #[cfg(any(not(feature = "sqlite"), not(feature = "redis")))]
    fn feature_off(&self, feature: &'static str) -> OpenStoreError {
        OpenStoreError::FeatureOff {
            location: self.shown(),
            feature,
        }
    }
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

    #[test]
    fn a_redis_password_is_never_shown() {
        let location = StoreLocation::Redis("redis://user:secret@cache.example:6379/0".into());
        assert_eq!(location.shown(), "redis://…@cache.example:6379/0");
        let plain = StoreLocation::Redis("redis://cache.example".into());
        assert_eq!(plain.shown(), "redis://cache.example");
    }

    #[tokio::test]
    async fn memory_opens_an_empty_store() {
        let store = StoreLocation::Memory.open().await.unwrap();
        assert_eq!(store.account_balance("a").await.unwrap().balance_nanos, 0);
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn a_sqlite_file_that_cannot_be_made_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("state.db");
        let location = StoreLocation::Sqlite(path.clone());
        let Err(error) = location.open().await else {
            panic!("a file in a missing directory cannot be opened");
        };
        assert!(matches!(error, OpenStoreError::Store { .. }));
        assert!(
            error.to_string().contains(&path.display().to_string()),
            "{error}"
        );
    }

    #[cfg(not(feature = "redis"))]
    #[tokio::test]
    async fn a_backend_built_without_is_named_by_its_feature() {
        let location = StoreLocation::Redis("redis://127.0.0.1".into());
        let Err(error) = location.open().await else {
            panic!("no redis in this build");
        };
        assert!(
            error.to_string().contains("`redis` cargo feature"),
            "{error}"
        );
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
