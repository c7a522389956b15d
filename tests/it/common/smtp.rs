//! A small SMTP server on loopback for tests: enough of the protocol for
//! lettre (greeting, EHLO/HELO, MAIL FROM, RCPT TO, DATA with
//! dot-unstuffing, RSET, NOOP, QUIT), no TLS and no AUTH. It records each
//! accepted message and can be told to answer the next transactions with
//! a temporary (451) or permanent (550) failure.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The longest command line or data line read; longer ends the session.
const MAX_LINE_BYTES: usize = 64 * 1024;

/// One message the server accepted.
#[derive(Clone, Debug)]
pub struct Message {
    /// The envelope sender (`MAIL FROM`), without the angle brackets.
    pub from: String,
    /// The envelope recipients (`RCPT TO`), in order.
    pub recipients: Vec<String>,
    /// The message as sent after `DATA`, dot-unstuffed, without the final
    /// `.` line; CRLF line ends kept.
    pub data: String,
}

impl Message {
    /// The header section.
    pub fn headers(&self) -> &str {
        self.data
            .split_once("\r\n\r\n")
            .map_or(self.data.as_str(), |(headers, _)| headers)
    }

    /// The body, after the first empty line.
    pub fn body(&self) -> &str {
        self.data
            .split_once("\r\n\r\n")
            .map_or("", |(_, body)| body)
    }

    /// The first header named `name` (any case), unfolded.
    pub fn header(&self, name: &str) -> Option<String> {
        let mut found: Option<String> = None;
        for line in self.headers().split("\r\n") {
            match &mut found {
                Some(value) if line.starts_with([' ', '\t']) => value.push_str(line),
                Some(_) => break,
                None => {
                    if let Some((field, value)) = line.split_once(':')
                        && field.eq_ignore_ascii_case(name)
                    {
                        found = Some(value.trim_start().to_owned());
                    }
                }
            }
        }
        found
    }
}

struct Shared {
    messages: watch::Sender<Vec<Message>>,
    /// Transactions still to answer 451 at the end of DATA.
    fail_next: AtomicUsize,
    /// Transactions still to answer 550 at the end of DATA.
    refuse_next: AtomicUsize,
    /// Transactions that reached the end of DATA, answered either way.
    transactions: AtomicUsize,
    connections: AtomicUsize,
}

/// An SMTP server on 127.0.0.1 at a free port, served on the current
/// runtime until the test ends.
pub struct SmtpServer {
    address: SocketAddr,
    shared: Arc<Shared>,
}

impl SmtpServer {
    /// Starts one.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let address = listener.local_addr().expect("local address");
        let shared = Arc::new(Shared {
            messages: watch::Sender::new(Vec::new()),
            fail_next: AtomicUsize::new(0),
            refuse_next: AtomicUsize::new(0),
            transactions: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
        });
        let serving = Arc::clone(&shared);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                serving.connections.fetch_add(1, Ordering::SeqCst);
                let shared = Arc::clone(&serving);
                tokio::spawn(async move {
                    let (reader, writer) = stream.into_split();
                    let _ = session(BufReader::new(reader), writer, &shared).await;
                });
            }
        });
        SmtpServer { address, shared }
    }

    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `smtp://127.0.0.1:PORT`: plain SMTP, for lettre's `from_url`.
    pub fn url(&self) -> String {
        format!("smtp://{}", self.address)
    }

    /// Answers the next `transactions` with `451` after their data.
    pub fn fail_next(&self, transactions: usize) {
        self.shared.fail_next.store(transactions, Ordering::SeqCst);
    }

    /// Answers the next `transactions` with `550` after their data.
    pub fn refuse_next(&self, transactions: usize) {
        self.shared
            .refuse_next
            .store(transactions, Ordering::SeqCst);
    }

    /// The messages accepted so far.
    pub fn messages(&self) -> Vec<Message> {
        self.shared.messages.borrow().clone()
    }

    /// Transactions that sent their data, accepted or failed.
    pub fn transactions(&self) -> usize {
        self.shared.transactions.load(Ordering::SeqCst)
    }

    /// Connections accepted.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// The messages once at least `count` were accepted; panics, naming
    /// what arrived, after `timeout`.
    pub async fn wait_for(&self, count: usize, timeout: Duration) -> Vec<Message> {
        let mut messages = self.shared.messages.subscribe();
        let waited = tokio::time::timeout(timeout, async {
            // The sender lives in `self`: the channel stays open.
            let _ = messages.wait_for(|messages| messages.len() >= count).await;
        })
        .await;
        let messages = self.messages();
        assert!(
            waited.is_ok(),
            "{} of {count} messages within {timeout:?}: {messages:#?}",
            messages.len()
        );
        messages
    }
}

/// Takes one from `counter` if it is above zero.
fn take_one(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
            left.checked_sub(1)
        })
        .is_ok()
}

/// One connection's conversation, until QUIT or the client goes.
async fn session<R, W>(
    mut reader: BufReader<R>,
    mut writer: W,
    shared: &Shared,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    writer
        .write_all(b"220 localhost test SMTP ready\r\n")
        .await?;
    let mut from: Option<String> = None;
    let mut recipients: Vec<String> = Vec::new();
    let mut line = Vec::new();
    loop {
        if !read_line(&mut reader, &mut line).await? {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&line);
        let command = text.trim_end();
        let verb = command
            .split([' ', ':'])
            .next()
            .unwrap_or("")
            .to_ascii_uppercase();
        let reply: &[u8] = match verb.as_str() {
            "EHLO" => b"250-localhost\r\n250-8BITMIME\r\n250 SMTPUTF8\r\n",
            "HELO" => b"250 localhost\r\n",
            "MAIL" => {
                from = Some(address_in(command));
                recipients.clear();
                b"250 2.1.0 OK\r\n"
            }
            "RCPT" if from.is_some() => {
                recipients.push(address_in(command));
                b"250 2.1.5 OK\r\n"
            }
            "RCPT" => b"503 5.5.1 MAIL first\r\n",
            "DATA" if recipients.is_empty() => b"503 5.5.1 RCPT first\r\n",
            "DATA" => {
                writer
                    .write_all(b"354 End data with <CR><LF>.<CR><LF>\r\n")
                    .await?;
                let Some(data) = read_data(&mut reader, &mut line).await? else {
                    return Ok(());
                };
                shared.transactions.fetch_add(1, Ordering::SeqCst);
                let envelope_from = from.take().unwrap_or_default();
                let envelope_to = std::mem::take(&mut recipients);
                if take_one(&shared.fail_next) {
                    b"451 4.3.0 Try again later\r\n"
                } else if take_one(&shared.refuse_next) {
                    b"550 5.1.1 No such mailbox\r\n"
                } else {
                    shared.messages.send_modify(|messages| {
                        messages.push(Message {
                            from: envelope_from,
                            recipients: envelope_to,
                            data,
                        })
                    });
                    b"250 2.0.0 OK queued\r\n"
                }
            }
            "RSET" => {
                from = None;
                recipients.clear();
                b"250 2.0.0 OK\r\n"
            }
            "NOOP" => b"250 2.0.0 OK\r\n",
            "QUIT" => {
                writer.write_all(b"221 2.0.0 Bye\r\n").await?;
                return writer.shutdown().await;
            }
            _ => b"502 5.5.2 Command not implemented\r\n",
        };
        writer.write_all(reply).await?;
    }
}

/// Reads one line, its CRLF kept, into `line`; `false` at the end of the
/// stream or past [`MAX_LINE_BYTES`].
async fn read_line<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    line: &mut Vec<u8>,
) -> std::io::Result<bool> {
    line.clear();
    let read = (&mut *reader)
        .take(MAX_LINE_BYTES as u64)
        .read_until(b'\n', line)
        .await?;
    Ok(read > 0 && line.ends_with(b"\n"))
}

/// The message data up to the `.` line, dot-unstuffed; `None` if the
/// client went first.
async fn read_data<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    line: &mut Vec<u8>,
) -> std::io::Result<Option<String>> {
    let mut data = Vec::new();
    loop {
        if !read_line(reader, line).await? {
            return Ok(None);
        }
        if line == b".\r\n" || line == b".\n" {
            return Ok(Some(String::from_utf8_lossy(&data).into_owned()));
        }
        // A line the client began with a dot had one added.
        let unstuffed = line.strip_prefix(b".").unwrap_or(line);
        data.extend_from_slice(unstuffed);
    }
}

/// The address between `<` and `>` in `MAIL FROM:<a>` or `RCPT TO:<b>`.
fn address_in(command: &str) -> String {
    command
        .split_once('<')
        .and_then(|(_, rest)| rest.split_once('>'))
        .map(|(address, _)| address.to_owned())
        .unwrap_or_default()
}

/// An address on 127.0.0.1 where nothing listens (bound, then let go).
pub fn closed_address() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    listener.local_addr().expect("local address")
}
