//! The examples' server loop: HTTP/1 and HTTP/2 over TCP, the client's
//! address in each request's extensions, and a graceful stop on Ctrl-C or
//! SIGTERM that ends the responses still open after a grace period, so
//! that each is settled before the process exits.

#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use modelgate::credit::PendingSettlements;
use modelgate::keys::SharedStore;
use modelgate::proxy::GatewayService;
use modelgate::store::{
    OpenOptions, RedisStore, RedisStoreConfig, SqliteStoreConfig, StoreLocation,
};
use modelgate::webhook::ClientAddr;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tower::ServiceBuilder;

/// Largest read buffer of one HTTP/1 connection, headers included.
pub const READ_BUFFER_BYTES: usize = 64 * 1024;

/// How long the connections whose responses the gateway ended after the
/// grace have to close before they are dropped.
const ENDED_RESPONSES_CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Serves `service` on `listener` until `shutdown` completes, then stops
/// accepting and lets requests in flight finish for up to `grace`. The
/// responses still open after it are ended
/// ([`PendingSettlements::end_streams`] of `open_responses`: each settles
/// as cut short), and the connections that still do not close are dropped
/// (their responses settle as abandoned). Returns once every connection
/// is gone: every settlement is then pending or recorded.
pub async fn serve(
    listener: TcpListener,
    service: GatewayService<Incoming>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
    open_responses: &PendingSettlements,
) {
    let graceful = GracefulShutdown::new();
    // Owned here so that connections still open at the end can be dropped
    // while the runtime runs, which settles their responses.
    let mut connections = JoinSet::new();
    let mut builder = Builder::new(TokioExecutor::new());
    // A client that never finishes its headers cannot hold a connection;
    // each connection's read buffer stays small (hyper's default grows to
    // ~400 KiB), since many connections may be sending bodies at once.
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        .max_buf_size(READ_BUFFER_BYTES);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of descriptors and the like: back off, do not spin.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                // A response's last bytes (the end of a metered body, sent once
                // its cost is recorded) must not wait for the client's delayed ACK.
                let _ = stream.set_nodelay(true);
                // Per-client limits (the webhook routes') key on the peer's address.
                let service = ServiceBuilder::new()
                    .map_request(move |mut request: http::Request<Incoming>| {
                        request.extensions_mut().insert(ClientAddr(peer.ip()));
                        request
                    })
                    .service(service.clone());
                let connection = builder.serve_connection_with_upgrades(
                    TokioIo::new(stream),
                    TowerToHyperService::new(service),
                );
                let connection = graceful.watch(connection.into_owned());
                connections.spawn(async move {
                    let _ = connection.await;
                });
            }
            // Closed connections leave the set: it holds the open ones only.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    tracing::info!(
        grace_seconds = grace.as_secs_f64(),
        "shutting down: finishing requests in flight"
    );
    let closed = graceful.shutdown();
    tokio::pin!(closed);
    if tokio::time::timeout(grace, &mut closed).await.is_ok() {
        tracing::info!("all connections closed");
        return;
    }
    tracing::warn!("requests still in flight after the grace period: ending their responses");
    open_responses.end_streams();
    if tokio::time::timeout(ENDED_RESPONSES_CLOSE_WAIT, &mut closed)
        .await
        .is_ok()
    {
        tracing::info!("all connections closed");
        return;
    }
    tracing::warn!(
        open = connections.len(),
        "connections still open after their responses were ended: dropping them"
    );
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

/// Redis at `url` for a migration: its layout not checked.
pub async fn open_store_to_migrate(url: &str) -> Result<RedisStore, String> {
    let config = RedisStoreConfig {
        check_layout: false,
        ..RedisStoreConfig::default()
    };
    RedisStore::connect(url, config)
        .await
        .map_err(|error| format!("cannot use --redis {url}: {error}"))
}

/// The file a proxy keeps its state in when given no store.
pub const DEFAULT_STORE_FILE: &str = "modelgate.db";

/// Where the state lives: `--store` (`memory`, `sqlite:PATH`, a Redis
/// URL), or `--redis URL` (the same as `--store URL`); in
/// [`DEFAULT_STORE_FILE`] in the working directory when neither is given.
pub fn store_location(store: Option<&str>, redis: Option<&str>) -> Result<StoreLocation, String> {
    match (store, redis) {
        (Some(_), Some(_)) => {
            Err("give --store or --redis, not both (--redis URL means --store URL)".to_owned())
        }
        (Some(text), None) => text
            .parse()
            .map_err(|error| format!("cannot use --store: {error}")),
        (None, Some(url)) => Ok(StoreLocation::Redis(url.to_owned())),
        (None, None) => Ok(StoreLocation::Sqlite(DEFAULT_STORE_FILE.into())),
    }
}

/// The store at `location`; a SQLite file opened as `sqlite` says.
pub async fn open_store(
    location: &StoreLocation,
    sqlite: &SqliteStoreConfig,
) -> Result<SharedStore, String> {
    let mut options = OpenOptions::default();
    options.sqlite = sqlite.clone();
    location
        .open_with(&options)
        .await
        .map_err(|error| error.to_string())
}

/// Logs to stderr at `RUST_LOG` (default `info`); stdout stays for what
/// the operator must read (the address, a key shown once). Built with the
/// `otel` feature and given `OTEL_EXPORTER_OTLP_ENDPOINT`, it also exports
/// the request spans over OTLP/HTTP. Colours only on a terminal: a file
/// or a collector gets plain text.
///
/// Lines go through a [`BatchedStderr`]; dropping the returned guard
/// writes what is left.
#[must_use = "dropping the guard stops the log writer"]
pub fn init_logging() -> LogGuard {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    use modelgate::credit::GEN_AI_SPAN_TARGET;
    use tracing_subscriber::Layer as _;

    #[cfg(feature = "otel")]
    let otel_endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok();
    #[cfg(not(feature = "otel"))]
    let otel_endpoint: Option<String> = None;
    let mut filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    if otel_endpoint.is_none() {
        // The model-call spans are for an OpenTelemetry backend: without
        // one, none is made at all.
        let off = format!("{GEN_AI_SPAN_TARGET}=off");
        filter = filter.add_directive(off.parse().expect("a valid directive"));
    }
    let (writer, guard) = BatchedStderr::start();
    let fmt = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_writer(writer);
    // On a terminal, tracing's own colourful lines; elsewhere the same
    // text without styling, which costs a request's log line a fraction
    // of the CPU (the default formatter styles every part even when
    // colours are off).
    let fmt: Box<dyn tracing_subscriber::Layer<_> + Send + Sync> =
        if std::io::stderr().is_terminal() {
            Box::new(fmt.with_ansi(true))
        } else {
            Box::new(
                fmt.with_ansi(false)
                    .event_format(plain_log::PlainLine)
                    .fmt_fields(plain_log::PlainFields),
            )
        };
    // The log keeps to its own lines: a model call's span goes to the
    // exporter only. Without one none is made (above), and the log needs
    // no filter of its own, which would cost every line a check.
    let fmt: Box<dyn tracing_subscriber::Layer<_> + Send + Sync> = if otel_endpoint.is_some() {
        Box::new(
            fmt.with_filter(tracing_subscriber::filter::filter_fn(|metadata| {
                metadata.target() != GEN_AI_SPAN_TARGET
            })),
        )
    } else {
        fmt
    };
    let registry = tracing_subscriber::registry().with(filter).with(fmt);
    #[cfg(feature = "otel")]
    if let Some(endpoint) = otel_endpoint {
        let traces = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
        match modelgate::telemetry::otel::otlp_layer("modelgate", &traces) {
            Ok((layer, provider)) => {
                registry.with(layer).init();
                // Lives as long as the process: spans export until exit.
                std::mem::forget(provider);
                return guard;
            }
            Err(error) => eprintln!("OpenTelemetry export disabled: {error}"),
        }
    }
    registry.init();
    guard
}

/// Log lines as tracing's default format writes them without colours
/// (`time LEVEL span{fields}: message field=value…`), written straight
/// into the line without the styling steps.
mod plain_log {
    use std::fmt;

    use tracing::field::{Field, Visit};
    use tracing::{Event, Subscriber};
    use tracing_subscriber::field::RecordFields;
    use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
    use tracing_subscriber::fmt::{FmtContext, FormattedFields};
    use tracing_subscriber::registry::LookupSpan;

    /// The line: time, level, the spans the event is in, its fields.
    pub struct PlainLine;

    impl<S, N> FormatEvent<S, N> for PlainLine
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'a> FormatFields<'a> + 'static,
    {
        fn format_event(
            &self,
            ctx: &FmtContext<'_, S, N>,
            mut writer: Writer<'_>,
            event: &Event<'_>,
        ) -> fmt::Result {
            write_time(&mut writer)?;
            let level = match *event.metadata().level() {
                tracing::Level::ERROR => "ERROR",
                tracing::Level::WARN => " WARN",
                tracing::Level::INFO => " INFO",
                tracing::Level::DEBUG => "DEBUG",
                tracing::Level::TRACE => "TRACE",
            };
            write!(writer, " {level} ")?;
            if let Some(scope) = ctx.event_scope() {
                for span in scope.from_root() {
                    writer.write_str(span.metadata().name())?;
                    if let Some(fields) = span.extensions().get::<FormattedFields<N>>()
                        && !fields.is_empty()
                    {
                        write!(writer, "{{{fields}}}")?;
                    }
                    writer.write_char(':')?;
                }
                writer.write_char(' ')?;
            }
            ctx.format_fields(writer.by_ref(), event)?;
            writeln!(writer)
        }
    }

    /// The time as tracing's `SystemTime` writes it
    /// (`2026-11-30T18:03:50.123456Z`), its text up to the second kept
    /// for the second it names: most lines of a second share it, and
    /// formatting a date costs a line more than the rest of its time.
    fn write_time(writer: &mut Writer<'_>) -> fmt::Result {
        use chrono::Timelike;
        use modelgate::clock::{Clock, SystemClock};
        use std::cell::RefCell;

        thread_local! {
            static SECOND: RefCell<(i64, String)> = const { RefCell::new((i64::MIN, String::new())) };
        }
        let now = SystemClock.now();
        let micros = now.nanosecond() % 1_000_000_000 / 1_000;
        SECOND.with(|second| {
            let mut second = second.borrow_mut();
            if second.0 != now.timestamp() {
                second.1 = now.format("%Y-%m-%dT%H:%M:%S").to_string();
                second.0 = now.timestamp();
            }
            writer.write_str(&second.1)?;
            // Six digits, zero-padded: what `{:06}` gives, without the
            // formatter.
            let mut digits = *b".000000Z";
            let mut rest = micros;
            for digit in digits[1..7].iter_mut().rev() {
                *digit = b'0' + (rest % 10) as u8;
                rest /= 10;
            }
            writer.write_str(std::str::from_utf8(&digits).map_err(|_| fmt::Error)?)
        })
    }

    /// Fields as `name=value`, separated by spaces; strings quoted and
    /// escaped (a value cannot forge a line), the message bare.
    pub struct PlainFields;

    impl<'writer> FormatFields<'writer> for PlainFields {
        fn format_fields<R: RecordFields>(
            &self,
            writer: Writer<'writer>,
            fields: R,
        ) -> fmt::Result {
            let mut visitor = PlainVisitor {
                writer,
                result: Ok(()),
                first: true,
            };
            fields.record(&mut visitor);
            visitor.result
        }
    }

    struct PlainVisitor<'writer> {
        writer: Writer<'writer>,
        result: fmt::Result,
        first: bool,
    }

    impl PlainVisitor<'_> {
        fn field(&mut self, field: &Field, value: fmt::Arguments<'_>) {
            if self.result.is_err() {
                return;
            }
            let separator = if std::mem::take(&mut self.first) {
                ""
            } else {
                " "
            };
            self.result = match field.name() {
                "message" => write!(self.writer, "{separator}{value}"),
                // `r#type` and the like: the name without the prefix.
                name => write!(
                    self.writer,
                    "{separator}{}={value}",
                    name.strip_prefix("r#").unwrap_or(name)
                ),
            };
        }
    }

    impl PlainVisitor<'_> {
        /// `name="value"` for a value with nothing to escape (what `{:?}`
        /// prints for it), written without the formatter.
        fn plain_str(&mut self, field: &Field, value: &str) {
            if self.result.is_err() {
                return;
            }
            if !std::mem::take(&mut self.first) {
                self.result = self.writer.write_char(' ');
            }
            let name = field.name();
            for part in [name.strip_prefix("r#").unwrap_or(name), "=\"", value, "\""] {
                if self.result.is_ok() {
                    self.result = self.writer.write_str(part);
                }
            }
        }
    }

    impl Visit for PlainVisitor<'_> {
        fn record_str(&mut self, field: &Field, value: &str) {
            if field.name() == "message" {
                self.field(field, format_args!("{value}"));
            } else if !value.bytes().fold(false, |escaped, byte| {
                // No early exit: the compiler vectorises the pass.
                escaped | !(b' '..=b'~').contains(&byte) | (byte == b'"') | (byte == b'\\')
            }) {
                self.plain_str(field, value);
            } else {
                self.field(field, format_args!("{value:?}"));
            }
        }

        fn record_u64(&mut self, field: &Field, value: u64) {
            self.field(field, format_args!("{value}"));
        }

        fn record_i64(&mut self, field: &Field, value: i64) {
            self.field(field, format_args!("{value}"));
        }

        fn record_bool(&mut self, field: &Field, value: bool) {
            self.field(field, format_args!("{value}"));
        }

        fn record_f64(&mut self, field: &Field, value: f64) {
            self.field(field, format_args!("{value}"));
        }

        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            self.field(field, format_args!("{value:?}"));
        }
    }
}

/// How often the log writer thread writes what has gathered.
const LOG_FLUSH_INTERVAL: Duration = Duration::from_millis(20);
/// Past this many buffered bytes, the request thread that logs writes the
/// buffer itself: memory stays bounded and no line is dropped.
const LOG_BUFFER_MAX_BYTES: usize = 1 << 20;

/// Log lines gathered in memory and written to stderr every
/// [`LOG_FLUSH_INTERVAL`] by one thread. Under load a request thread pays
/// for a short lock and a copy, not for a `write(2)` of its own and the
/// wake-up of a logger thread per line (the first measured about a tenth
/// of the proxy's CPU, a channel-fed logger thread as much).
#[derive(Clone)]
pub struct BatchedStderr {
    shared: Arc<LogShared>,
}

struct LogShared {
    buffer: std::sync::Mutex<Vec<u8>>,
    stopping: std::sync::Mutex<bool>,
    stop: std::sync::Condvar,
}

/// Stops [`BatchedStderr`]'s thread and writes what is left.
pub struct LogGuard {
    shared: Arc<LogShared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BatchedStderr {
    fn start() -> (Self, LogGuard) {
        let shared = Arc::new(LogShared {
            buffer: std::sync::Mutex::new(Vec::with_capacity(64 * 1024)),
            stopping: std::sync::Mutex::new(false),
            stop: std::sync::Condvar::new(),
        });
        let thread = std::thread::Builder::new()
            .name("modelgate-log".into())
            .spawn({
                let shared = Arc::clone(&shared);
                move || loop {
                    let stopping = shared.stopping.lock().unwrap_or_else(|e| e.into_inner());
                    let (stopping, _) = shared
                        .stop
                        .wait_timeout_while(stopping, LOG_FLUSH_INTERVAL, |stopping| !*stopping)
                        .unwrap_or_else(|e| e.into_inner());
                    let last = *stopping;
                    drop(stopping);
                    shared.write_out();
                    if last {
                        break;
                    }
                }
            })
            .expect("the log writer thread starts");
        let writer = BatchedStderr {
            shared: Arc::clone(&shared),
        };
        (
            writer,
            LogGuard {
                shared,
                thread: Some(thread),
            },
        )
    }
}

impl LogShared {
    /// Takes the buffer's lines and writes them, outside the lock.
    fn write_out(&self) {
        let lines = {
            let mut buffer = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
            if buffer.is_empty() {
                return;
            }
            std::mem::replace(&mut *buffer, Vec::with_capacity(64 * 1024))
        };
        // Nowhere to report a failed write to stderr.
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), &lines);
    }
}

impl std::io::Write for &BatchedStderr {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let full = {
            let mut buffer = self.shared.buffer.lock().unwrap_or_else(|e| e.into_inner());
            buffer.extend_from_slice(bytes);
            buffer.len() >= LOG_BUFFER_MAX_BYTES
        };
        if full {
            self.shared.write_out();
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BatchedStderr {
    type Writer = &'a BatchedStderr;

    fn make_writer(&'a self) -> Self::Writer {
        self
    }
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        *self
            .shared
            .stopping
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = true;
        self.shared.stop.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
