//! The standalone gateway: every modelgate layer in front of an
//! OpenAI-compatible upstream.
//!
//! ```sh
//! cargo run --release --features proxy --example proxy -- [--listen ADDR] [--upstream URL] [--store memory|sqlite:PATH|redis://…] [--config FILE]
//! cargo run --release --features proxy --example proxy -- keygen
//! cargo run --release --features proxy --example proxy -- reset-operator-key --store sqlite:PATH|redis://…
//! ```
//!
//! `proxy --help` lists every flag with its default, the commands and the
//! environment variables.
//!
//! - `--listen`: where to serve (default `127.0.0.1:8080`).
//! - `--admin-listen`: where `/metrics` (Prometheus), `/healthz` and
//!   `/readyz` are served (default `127.0.0.1:9091`, loopback only).
//! - `--upstream`: the upstream's base URL, such as
//!   `https://api.openai.com/v1` (its key from the config's
//!   `upstream.api_key_env`). Without it the built-in mock upstream runs in
//!   process.
//! - `--store`: where the state lives: `sqlite:PATH` (one file on this
//!   machine, kept across restarts; several proxies on the machine may
//!   share it; the default is `sqlite:modelgate.db` in the working
//!   directory), `memory` (lost when the process stops), or a Redis URL
//!   (`redis://127.0.0.1:6379`, `rediss://…`) for many machines.
//! - `--redis URL`: the same as `--store URL`.
//! - `--bare` (or `--bare true`): the upstream client with no layer at all,
//!   the baseline `bench/load.sh` compares against; it warns that no key
//!   is checked.
//! - `--worker-threads N`: the threads that serve requests (default: one
//!   per core); fewer on a machine whose cores other busy processes share.
//! - `--config`: a JSON file (see `modelgate::proxy::GatewayConfig`); its
//!   `plugins.entries.webhooks` routes are served too, and every SecretRef
//!   in it reads from its `secrets.providers`.
//!
//! The operator's key comes from `MODELGATE_ADMIN_KEY`; when that is unset
//! and the store has no operator's key yet, one is generated and printed
//! once (a later start prints none and says how to set one). At start,
//! operator keys an older store keeps on a tenant account move to the
//! operator's own account.
//!
//! - `keygen`: prints a new well-formed key for `MODELGATE_ADMIN_KEY` and
//!   exits; touches no store.
//! - `reset-operator-key --store S` (or `--redis URL`): when the operator's key is lost or
//!   leaked, disables every operator key in that store and prints one new
//!   key, once.
//! - `migrate-store --redis URL`: moves a store an older version wrote to
//!   this version's layout (a proxy refuses such a store and names this
//!   command); run once, with the older instances stopped.
//!
//! Ctrl-C or SIGTERM stops accepting,
//! lets requests in flight finish, waits for every settlement to reach the
//! store (as long as each is retried, 2 minutes, and no longer than
//! `shutdown_grace_seconds`), logs any it could not record with its
//! account, key hash prefix and amount, then exits.

#[path = "support/admin.rs"]
mod admin;
#[path = "support/mock.rs"]
mod mock;
#[path = "support/serve.rs"]
mod serve;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use modelgate::auth::ApiKey;
use modelgate::keys::{DEFAULT_ACCOUNT, KeyDirectory, NewKey, SharedStore};
use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use modelgate::clock::SystemClock;
use modelgate::credit::PendingSettlements;
use modelgate::error::{ErrorKind, GatewayError};
use modelgate::proxy::{
    GatewayBody, GatewayConfig, GatewayPlan, GatewayService, Upstream, build_gateway,
};
use modelgate::store::SETTLEMENT_RETRY_WINDOW;
use tokio::net::TcpListener;

/// How long a stopping proxy waits, after its deadline, for the
/// settlements of what it ended then (late answers given up).
const LAST_SETTLEMENTS_WAIT: Duration = Duration::from_secs(5);

/// How long a stopping proxy waits for its last alerts to go out (no
/// money rides on them; a send still retrying is given up).
const ALERTS_DEADLINE: Duration = Duration::from_secs(5);

/// The environment the proxy reads, shown under `--help`.
const ENVIRONMENT: &str = "Environment:
  MODELGATE_ADMIN_KEY          the operator's key (make one with `proxy keygen`); unset, a
                               store without one gets a new one, printed once
  RUST_LOG                     what is logged (default: info), e.g. RUST_LOG=debug
  OTEL_EXPORTER_OTLP_ENDPOINT  export spans over OTLP/HTTP there, e.g. http://127.0.0.1:4318
                               (with the otel feature: --features proxy,otel)
  the variable the config's upstream.api_key_env (or a provider's) names
                               the upstream's key";

/// modelgate's gateway: every layer in front of an OpenAI-compatible
/// upstream, serving `http://ADDR/api/v1` to any OpenAI-style client.
#[derive(clap::Parser)]
#[command(name = "proxy", after_help = ENVIRONMENT, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeFlags,
}

#[derive(clap::Args)]
struct ServeFlags {
    /// Where to serve.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Where /metrics (Prometheus), /healthz and /readyz are served.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9091")]
    admin_listen: SocketAddr,
    /// The upstream's base URL, such as https://api.openai.com/v1 (its key
    /// from the config's upstream.api_key_env) [default: the config's
    /// upstream.base_url, else a built-in mock upstream]
    #[arg(long, value_name = "URL")]
    upstream: Option<String>,
    #[command(flatten)]
    store: StoreFlags,
    /// The gateway's JSON configuration (prices, rate limits, providers, …).
    #[arg(long, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// The upstream client alone: no key is checked and no limit holds.
    /// Only the baseline bench/load.sh measures against.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    bare: bool,
    /// The threads that serve requests [default: one per core]. Fewer
    /// when the machine's cores are shared with other busy processes (the
    /// upstream, Redis): a request's steps then wake fewer threads.
    #[arg(long, value_name = "N")]
    worker_threads: Option<std::num::NonZeroUsize>,
}

/// Where the state lives.
#[derive(clap::Args)]
struct StoreFlags {
    /// memory (lost on stop), sqlite:PATH (one file on this machine, kept
    /// across restarts) or a Redis URL (redis://…, rediss://…) shared by
    /// many machines [default: sqlite:modelgate.db]
    #[arg(long, value_name = "STORE")]
    store: Option<String>,
    /// The same as --store URL.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
}

impl StoreFlags {
    fn location(&self) -> Result<modelgate::store::StoreLocation, String> {
        serve::store_location(self.store.as_deref(), self.redis.as_deref())
    }
}

#[derive(clap::Subcommand)]
enum Command {
    /// Print a new well-formed key, for MODELGATE_ADMIN_KEY; touches no store.
    Keygen,
    /// Disable every operator key in the store and print one new key, once
    /// (when the operator's key is lost or leaked).
    ResetOperatorKey {
        #[command(flatten)]
        store: StoreFlags,
    },
    /// Move a Redis store an older version wrote to this version's layout;
    /// run once, with the older instances stopped.
    MigrateStore {
        /// The Redis to migrate.
        #[arg(long, value_name = "URL")]
        redis: String,
    },
}

/// The name of the operator's keys the proxy makes.
const OPERATOR_KEY_NAME: &str = "operator";

// Every request allocates on whichever worker runs it: glibc's malloc
// spent about a sixth of the proxy's CPU under load, part of it waiting on
// its arena locks; mimalloc's per-thread heaps do not contend.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // A bad flag is a usage error: clap says which, with the usage, and
    // exits 2; `--help` lists every flag with its default.
    let cli = <Cli as clap::Parser>::parse();
    // The runtime is built here, not by `#[tokio::main]`: its threads come
    // from a flag.
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Some(threads) = cli.serve.worker_threads {
        runtime.worker_threads(threads.get());
    }
    let runtime = runtime.build().unwrap_or_else(|error| {
        eprintln!("proxy: cannot start the runtime: {error}");
        std::process::exit(2);
    });
    runtime.block_on(async {
        let logging = serve::init_logging();
        if let Err(message) = run(cli).await {
            drop(logging);
            eprintln!("proxy: {message}");
            std::process::exit(2);
        }
    });
}

async fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        None => serve_gateway(cli.serve).await,
        Some(Command::Keygen) => {
            println!("{}", ApiKey::generate().expose());
            Ok(())
        }
        Some(Command::ResetOperatorKey { store }) => reset_operator_key(store.location()?).await,
        Some(Command::MigrateStore { redis }) => migrate_store(&redis).await,
    }
}

/// `proxy reset-operator-key --store S`: every operator key in the store
/// disabled, one new one printed once.
async fn reset_operator_key(location: modelgate::store::StoreLocation) -> Result<(), String> {
    if location == modelgate::store::StoreLocation::Memory {
        return Err(
            "reset-operator-key changes the store the proxies keep their keys in: name it with --store sqlite:PATH or --redis URL (a proxy on --store memory keeps its keys in memory; restart it instead)".to_owned()
        );
    }
    let store = serve::open_store(&location, &Default::default()).await?;
    let (key, disabled) = KeyDirectory::new(store)
        .replace_operator_keys(OPERATOR_KEY_NAME)
        .await
        .map_err(|error| format!("cannot replace the operator's key: {error}"))?;
    // Shown once, on stdout for the operator; never logged.
    println!("operator key (shown once): {}", key.expose());
    eprintln!(
        "disabled {disabled} operator key(s); running proxies refuse them within a second. Set MODELGATE_ADMIN_KEY to the new key before the proxies start again."
    );
    Ok(())
}

/// `proxy migrate-store --redis URL`: a store in an older layout moved to
/// this version's, once, with every older instance stopped.
async fn migrate_store(url: &str) -> Result<(), String> {
    let redis = serve::open_store_to_migrate(url).await?;
    let before = redis
        .layout()
        .await
        .map_err(|error| format!("cannot read the layout: {error}"))?
        .unwrap_or(1);
    if before > modelgate::store::LEDGER_LAYOUT {
        return Err(format!(
            "this store is in layout {before}, newer than this version's {}: run the newer version",
            modelgate::store::LEDGER_LAYOUT
        ));
    }
    let store: modelgate::keys::SharedStore = std::sync::Arc::new(redis.clone());
    let directory = KeyDirectory::new(store);
    let mut holds = 0;
    // Layout 3 differs from 4 only in where a GCRA state is read first,
    // which needs no move: keys' ledgers move from layouts 1 and 2.
    if before < 3 {
        let every_key = directory
            .every_key_s_account()
            .await
            .map_err(|error| format!("cannot list the keys: {error}"))?;
        for (account, key) in &every_key {
            holds += redis
                .move_key_ledger(account, key)
                .await
                .map_err(|error| format!("cannot move the ledger of key {key}: {error}"))?;
        }
        // Every account with a key, and every account recorded (one whose
        // keys were all deleted may still hold on its balance).
        let mut accounts: Vec<String> = every_key
            .iter()
            .map(|(account, _)| account.clone())
            .collect();
        let mut offset = 0;
        loop {
            let page = directory
                .accounts(offset, 500)
                .await
                .map_err(|error| format!("cannot list the accounts: {error}"))?;
            offset += page.len();
            let done = page.len() < 500;
            accounts.extend(page.into_iter().map(|account| account.id));
            if done {
                break;
            }
        }
        accounts.sort();
        accounts.dedup();
        for account in &accounts {
            redis
                .finish_account_ledger(account)
                .await
                .map_err(|error| {
                    format!("cannot finish the ledger of account {account}: {error}")
                })?;
        }
    }
    let keys = directory
        .write_every_key_s_terms()
        .await
        .map_err(|error| format!("cannot write the keys' terms: {error}"))?;
    redis
        .mark_layout_current()
        .await
        .map_err(|error| format!("cannot record the layout: {error}"))?;
    eprintln!(
        "migrated from layout {before} to {}: moved the ledger and wrote the terms of {keys} \
         key(s), with {holds} hold(s) in flight",
        modelgate::store::LEDGER_LAYOUT
    );
    Ok(())
}

async fn serve_gateway(flags: ServeFlags) -> Result<(), String> {
    let (listen, admin_listen) = (flags.listen, flags.admin_listen);
    if flags.bare {
        tracing::warn!(
            "--bare: no key is checked and no limit holds; every request goes upstream on the gateway's credentials"
        );
    }
    let metrics = admin::install_recorder()?;
    let config = match &flags.config {
        Some(path) => {
            let path = path.display();
            let text = std::fs::read_to_string(path.to_string())
                .map_err(|error| format!("cannot read --config {path}: {error}"))?;
            GatewayConfig::from_json(&text).map_err(|error| format!("{path}: {error}"))?
        }
        None => GatewayConfig::default(),
    };
    let sqlite = modelgate::store::SqliteStoreConfig {
        synchronous_full: config.sqlite.synchronous == modelgate::proxy::SqliteSynchronous::Full,
        ..Default::default()
    };
    let store = serve::open_store(&flags.store.location()?, &sqlite).await?;
    let base_url = match flags.upstream.clone().or(config.upstream.base_url.clone()) {
        Some(url) => url,
        None => {
            let url = mock::start(mock::MockConfig::default()).await;
            tracing::info!(%url, "no upstream given: the built-in mock upstream answers");
            url
        }
    };
    let upstream_config = config
        .upstream_config(Some(&base_url))
        .map_err(|error| error.to_string())?;
    let upstream = Upstream::new(&upstream_config).map_err(|error| error.to_string())?;
    // `--bare true`: the upstream client alone, no layer: the baseline of bench/load.sh.
    let (service, settlements, app_ranking, alerts) = if flags.bare {
        (bare(upstream), PendingSettlements::default(), None, None)
    } else {
        // The config's secrets are read and its provider clients built
        // here, once: what the gateway cannot use stops start-up.
        let plan = GatewayPlan::new(&config).map_err(|error| error.to_string())?;
        let gateway = build_gateway(
            &plan,
            store.clone(),
            upstream,
            Arc::new(SystemClock),
            KeyDirectory::DEFAULT_CACHE_TTL,
        );
        (
            gateway.service,
            gateway.settlements,
            Some(gateway.app_ranking),
            gateway.alerts,
        )
    };
    // Both ports before the operator's key: a start that cannot listen
    // must not make (and print, once) a key it then never serves.
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|error| format!("cannot listen on {listen}: {error}"))?;
    let address = listener.local_addr().map_err(|error| error.to_string())?;
    let admin_listener = TcpListener::bind(admin_listen)
        .await
        .map_err(|error| format!("cannot listen on --admin-listen {admin_listen}: {error}"))?;
    let admin_address = admin_listener
        .local_addr()
        .map_err(|error| error.to_string())?;
    operator_key(&store).await?;
    tokio::spawn(admin::serve(admin_listener, metrics, store.clone(), true));
    println!("modelgate listening on http://{address}");
    tracing::info!(
        worker_threads = tokio::runtime::Handle::current().metrics().num_workers(),
        "serving"
    );
    println!("admin (metrics, healthz, readyz) on http://{admin_address}");

    serve::serve(
        listener,
        service,
        serve::shutdown_signal(),
        config.shutdown_grace(),
        &settlements,
    )
    .await;
    // The requests have ended (those past the grace were ended and
    // charged for what they used); what they cost must reach the store before
    // the process does: waited for as long as each is retried, within the
    // grace the operator gives a stop. A granted hold that is not settled
    // lapses and is charged; only a cost without one is logged for booking
    // by hand.
    let pending = settlements.len();
    let deadline = SETTLEMENT_RETRY_WINDOW.min(config.shutdown_grace());
    if !settlements.settled_within(deadline).await {
        // Late answers still awaited are given up, charged their holds
        // (as are any responses still open).
        settlements.end_streams();
    }
    let unrecorded = settlements.flush(LAST_SETTLEMENTS_WAIT).await;
    tracing::info!(
        pending,
        unrecorded = unrecorded.len(),
        "settlements flushed; stopping"
    );
    // The app ranking's last second of counts, best effort: no money.
    if let Some(ranking) = app_ranking
        && let Err(error) = ranking.flush().await
    {
        tracing::warn!(%error, "app ranking: the last counts were not written");
    }
    // The last settlements' alerts, best effort.
    if let Some(alerts) = alerts
        && tokio::time::timeout(ALERTS_DEADLINE, alerts.idle())
            .await
            .is_err()
    {
        tracing::warn!("alerts: the last ones were not all sent before stopping");
    }
    Ok(())
}

/// Only the upstream client, errors as canonical responses: what the
/// proxy costs without any policy.
fn bare(upstream: Upstream) -> GatewayService<Incoming> {
    let service = tower::service_fn(move |request: Request<Incoming>| {
        let mut upstream = upstream.clone();
        async move {
            let (parts, body) = request.into_parts();
            let outcome = match body.collect().await {
                Err(_) => Err(GatewayError::new(
                    ErrorKind::InvalidRequest,
                    "the body could not be read",
                )),
                Ok(collected) => {
                    let request = Request::from_parts(parts, Full::new(collected.to_bytes()));
                    tower::Service::call(&mut upstream, request).await
                }
            };
            let response: Response<GatewayBody> = match outcome {
                Ok(response) => response.map(|body| body.map_err(Into::into).boxed_unsync()),
                Err(error) => error
                    .to_response::<Full<Bytes>>()
                    .map(|body| body.map_err(|never| match never {}).boxed_unsync()),
            };
            Ok::<_, Infallible>(response)
        }
    });
    tower::util::BoxCloneService::new(service)
}

/// Registers `MODELGATE_ADMIN_KEY` as an operator's key; without it,
/// makes and prints one only when the store has none, so that restarts on
/// a shared store do not pile up full-power keys in the container log.
async fn operator_key(store: &SharedStore) -> Result<(), String> {
    let directory = KeyDirectory::new(store.clone());
    // `default` exists from the start (keys without `account` go there);
    // every other account is made by POST /api/v1/accounts.
    directory
        .ensure_account(DEFAULT_ACCOUNT)
        .await
        .map_err(|error| format!("cannot record the default account: {error}"))?;
    // A store made before each account's keys were indexed gets its index
    // here once, not on an account's first listing.
    let indexed = directory
        .build_key_index()
        .await
        .map_err(|error| format!("cannot index the keys by account: {error}"))?;
    if indexed > 0 {
        tracing::info!(indexed, "keys indexed by account, once");
    }
    let moved = directory
        .move_operator_keys()
        .await
        .map_err(|error| format!("cannot move the operator's keys off the accounts: {error}"))?;
    if moved > 0 {
        tracing::info!(
            moved,
            "operator keys moved off the tenant accounts: no account's key reaches them now"
        );
    }
    let admin = NewKey {
        management: true,
        ..NewKey::named(OPERATOR_KEY_NAME)
    };
    match std::env::var("MODELGATE_ADMIN_KEY") {
        Ok(text) => {
            let key = ApiKey::parse(text.trim()).map_err(|error| {
                format!("MODELGATE_ADMIN_KEY is not a modelgate key: {error}; make one with `proxy keygen`")
            })?;
            let record = directory
                .register_key(&key, admin)
                .await
                .map_err(|error| format!("cannot register MODELGATE_ADMIN_KEY: {error}"))?;
            if !record.is_operator() {
                return Err(
                    "MODELGATE_ADMIN_KEY is registered as an account's key, not the operator's; make a new one with `proxy keygen`"
                        .into(),
                );
            }
            if record.disabled {
                return Err(
                    "MODELGATE_ADMIN_KEY is disabled (replaced by `proxy reset-operator-key`, or by hand); set it to the operator's current key"
                        .into(),
                );
            }
        }
        Err(_) => {
            // One create-if-absent write decides, so proxies starting
            // together on an empty store print one key between them.
            let minted = directory
                .mint_operator_key(OPERATOR_KEY_NAME)
                .await
                .map_err(|error| format!("cannot create the operator's key: {error}"))?;
            match minted {
                // Shown once, on stdout for the operator; never logged.
                Some(key) => println!("operator key (shown once): {}", key.expose()),
                None => tracing::warn!(
                    "MODELGATE_ADMIN_KEY is unset and the store has (or another start just made) an operator's key, so none is made or printed: set MODELGATE_ADMIN_KEY to that key (or to a new one from `proxy keygen`); if it is lost, run `proxy reset-operator-key` with this store (`--store` or `--redis`)"
                ),
            }
        }
    }
    Ok(())
}
