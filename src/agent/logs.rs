//! Container logs as kubelet serves them (`pods/{name}/log`) and their rotation.
//!
//! containerd writes each container's output to the file the agent names, in the CRI log format: one
//! chunk per line, `<RFC3339Nano> <stdout|stderr> <P|F> <content>`, where `P` marks a partial line
//! that the next chunk of the same stream continues and `F` ends it. [`read`] turns such a file into
//! what `kubectl logs` shows (kubelet's `ReadLogs`); [`rotate`] is kubelet's container log manager
//! applied to one file.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek as _, SeekFrom};
use std::os::unix::fs::{FileExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use chrono::{DateTime, FixedOffset, SecondsFormat, TimeDelta, Utc};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use tokio::io::AsyncReadExt as _;

use crate::registry::validation::{ErrorType, FieldError};

/// kubelet's `containerLogMaxSize` default (10Mi).
pub const DEFAULT_MAX_SIZE: u64 = 10 << 20;
/// kubelet's `containerLogMaxFiles` default.
pub const DEFAULT_MAX_FILES: usize = 5;
/// kubelet's `containerLogMonitorInterval` default.
pub const MONITOR_INTERVAL: Duration = Duration::from_secs(10);

/// How often a followed log is checked for new data, rotation and the container's end.
const POLL: Duration = Duration::from_millis(250);
/// Bytes read from the log file at a time.
const READ_SIZE: usize = 32 << 10;
/// Longest file line kept; containerd splits output into chunks of 16 KiB, so anything longer is corrupt.
const MAX_LINE: usize = 64 << 10;
/// Block size of the backwards scan that finds where the last lines start.
const TAIL_BLOCK: usize = 8 << 10;
/// Enough of a line to hold its timestamp, stream and tag.
const HEADER_MAX: usize = 128;
/// Suffix format of a rotated log (upstream's `20060102-150405`).
const ROTATED_FORMAT: &str = "%Y%m%d-%H%M%S";
const GZ_SUFFIX: &str = ".gz";
const TMP_SUFFIX: &str = ".tmp";

/// Which output stream to return (`PodLogOptions.stream`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogStream {
    #[default]
    All,
    Stdout,
    Stderr,
}

/// The options of a `pods/{name}/log` request, as the API server decodes and validates them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// `None` means the pod's only (or default) container.
    pub container: Option<String>,
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<i64>,
    /// From `sinceSeconds` (relative to the request) or `sinceTime`.
    pub since: Option<DateTime<Utc>>,
    pub limit_bytes: Option<i64>,
    pub stream: LogStream,
}

/// Why a log request's options were refused.
#[derive(Debug, thiserror::Error)]
pub enum LogOptionsError {
    /// A value that does not decode; upstream answers 400 BadRequest with this message.
    #[error("{0}")]
    BadRequest(String),
    /// Values that decode but are invalid; upstream answers 422 (`PodLogOptions "<pod>" is invalid: ...`).
    #[error("{}", render_field_errors(.0))]
    Invalid(Vec<FieldError>),
}

fn render_field_errors(errs: &[FieldError]) -> String {
    match errs {
        [one] => one.to_string(),
        many => format!("[{}]", many.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")),
    }
}

const NEGATIVE: &str = "must be greater than or equal to 0";
const NOT_POSITIVE: &str = "must be greater than 0";

/// `Invalid value: <n>: detail`, with the number unquoted as upstream prints integers.
fn invalid_int(field: &str, value: i64, detail: &str) -> FieldError {
    FieldError { kind: ErrorType::Invalid, field: field.into(), detail: format!("Invalid value: {value}: {detail}") }
}

impl LogOptions {
    /// Decodes the query of a `pods/{name}/log` request and validates it as the API server does
    /// (`ValidatePodLogOptions`). For repeated keys the first value counts; unknown keys are ignored.
    pub fn from_query(pairs: &[(String, String)], now: DateTime<Utc>) -> Result<LogOptions, LogOptionsError> {
        let first = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        // Upstream: only "false" (any case) and "0" are false once the key is present.
        let flag = |key: &str| first(key).is_some_and(|v| v != "0" && !v.eq_ignore_ascii_case("false"));
        let int = |key: &str| first(key).map(parse_int).transpose().map_err(LogOptionsError::BadRequest);

        let container = first("container").filter(|c| !c.is_empty()).map(str::to_string);
        let since_seconds = int("sinceSeconds")?;
        let since_time = first("sinceTime").map(parse_time).transpose().map_err(LogOptionsError::BadRequest)?;
        let tail_lines = int("tailLines")?;
        let limit_bytes = int("limitBytes")?;
        let stream = first("stream");

        let mut errs = Vec::new();
        if let Some(n) = tail_lines.filter(|n| *n < 0) {
            errs.push(invalid_int("tailLines", n, NEGATIVE));
        }
        if let Some(n) = limit_bytes.filter(|n| *n < 1) {
            errs.push(invalid_int("limitBytes", n, NOT_POSITIVE));
        }
        match (since_seconds, &since_time) {
            (Some(_), Some(_)) => {
                errs.push(FieldError::forbidden("", "at most one of `sinceTime` or `sinceSeconds` may be specified"))
            }
            (Some(n), None) if n < 1 => errs.push(invalid_int("sinceSeconds", n, NOT_POSITIVE)),
            _ => {}
        }
        let stream = match stream {
            None | Some("All") => LogStream::All,
            Some("Stdout") => LogStream::Stdout,
            Some("Stderr") => LogStream::Stderr,
            Some(other) => {
                errs.push(FieldError::not_supported("stream", other, &["Stdout", "Stderr", "All"]));
                LogStream::All
            }
        };
        if stream != LogStream::All && tail_lines.is_some() {
            errs.push(FieldError::forbidden("", "`tailLines` and specific `stream` are mutually exclusive for now"));
        }
        if !errs.is_empty() {
            return Err(LogOptionsError::Invalid(errs));
        }

        let since = match (since_seconds, since_time) {
            // Out of chrono's range means "since forever".
            (Some(n), _) => Some(TimeDelta::try_seconds(n).and_then(|d| now.checked_sub_signed(d)).unwrap_or_default()),
            (None, Some(t)) => t,
            (None, None) => None,
        };
        Ok(LogOptions {
            container,
            follow: flag("follow"),
            previous: flag("previous"),
            timestamps: flag("timestamps"),
            tail_lines,
            since,
            limit_bytes,
            stream,
        })
    }
}

/// Go's `strconv.ParseInt(s, 10, 64)`, with its error text.
fn parse_int(s: &str) -> Result<i64, String> {
    s.parse::<i64>().map_err(|e| {
        let why = match e.kind() {
            std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => "value out of range",
            _ => "invalid syntax",
        };
        format!("strconv.ParseInt: parsing {s:?}: {why}")
    })
}

/// `metav1.Time` from a query parameter: RFC 3339; empty or `null` is the zero time (no filter).
fn parse_time(s: &str) -> Result<Option<DateTime<Utc>>, String> {
    if s.is_empty() || s == "null" {
        return Ok(None);
    }
    DateTime::parse_from_rfc3339(s)
        .map(|t| Some(t.with_timezone(&Utc)))
        .map_err(|e| format!("parsing time {s:?} as \"2006-01-02T15:04:05Z07:00\": {e}"))
}

// ---------------------------------------------------------------------------------------------
// CRI log lines
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Stdout = 0,
    Stderr = 1,
}

/// One parsed line of a CRI log file.
#[derive(Debug, PartialEq, Eq)]
struct Entry<'a> {
    time: DateTime<FixedOffset>,
    source: Source,
    partial: bool,
    /// With its newline for a full line, without for a partial one.
    content: &'a [u8],
}

/// Splits `line` at the first space.
fn field(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let i = line.iter().position(|&b| b == b' ')?;
    Some((&line[..i], &line[i + 1..]))
}

/// Parses one CRI log line (upstream's `parseCRILog`); the error says what is wrong.
fn parse(line: &[u8]) -> Result<Entry<'_>, String> {
    let (time, rest) = field(line).ok_or("timestamp is not found")?;
    let time = std::str::from_utf8(time)
        .ok()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .ok_or_else(|| format!("unexpected timestamp format: {:?}", String::from_utf8_lossy(time)))?;
    let (source, rest) = field(rest).ok_or("stream type is not found")?;
    let source = match source {
        b"stdout" => Source::Stdout,
        b"stderr" => Source::Stderr,
        other => return Err(format!("unexpected stream type {:?}", String::from_utf8_lossy(other))),
    };
    let (tags, mut content) = field(rest).ok_or("log tag is not found")?;
    // Tags are `:`-separated for forward compatibility; the first one says partial or full.
    let partial = tags.split(|&b| b == b':').next() == Some(b"P");
    if partial && content.last() == Some(&b'\n') {
        content = &content[..content.len() - 1];
    }
    Ok(Entry { time, source, partial, content })
}

/// Whether the line starting at `start` and ending with the newline at `end` is a partial chunk.
fn is_partial_at(file: &File, start: u64, end: u64) -> io::Result<bool> {
    let len = usize::try_from(end - start + 1).unwrap_or(HEADER_MAX).min(HEADER_MAX);
    let mut head = vec![0; len];
    file.read_exact_at(&mut head, start)?;
    Ok(parse(&head).is_ok_and(|e| e.partial))
}

/// Where the last `n` complete log lines start, reading backwards in blocks (kubelet's
/// `FindTailLineStartIndex`, counting a line split into partial chunks once). A trailing line
/// without its newline is not counted.
fn tail_start(file: &File, n: u64) -> io::Result<u64> {
    let mut block = vec![0; TAIL_BLOCK];
    let mut right = file.metadata()?.len();
    // The newline ending the line whose start is being searched for.
    let mut end: Option<u64> = None;
    let mut full_lines = 0;
    // A line ending at `end` and starting at `start` is complete; returns where the tail starts once
    // it is the (n+1)-th full line from the end.
    let mut delimit = |start: u64, end: u64| -> io::Result<Option<u64>> {
        if is_partial_at(file, start, end)? {
            return Ok(None);
        }
        full_lines += 1;
        Ok((full_lines > n).then_some(end + 1))
    };
    while right > 0 {
        let left = right.saturating_sub(TAIL_BLOCK as u64);
        let buf = &mut block[..(right - left) as usize];
        file.read_exact_at(buf, left)?;
        for i in (0..buf.len()).rev().filter(|&i| buf[i] == b'\n') {
            let newline = left + i as u64;
            if let Some(end) = end
                && let Some(start) = delimit(newline + 1, end)?
            {
                return Ok(start);
            }
            end = Some(newline);
        }
        right = left;
    }
    if let Some(end) = end
        && let Some(start) = delimit(0, end)?
    {
        return Ok(start);
    }
    Ok(0)
}

/// Per-stream state of the logical line being written.
#[derive(Debug, Default, Clone, Copy)]
struct Open {
    /// The last chunk of this stream was partial.
    partial: bool,
    /// The current logical line passed the filters.
    shown: bool,
}

/// Turns CRI log lines into response bytes under the request's options (upstream's `logWriter`).
#[derive(Debug)]
struct Decoder {
    timestamps: bool,
    since: Option<DateTime<Utc>>,
    stream: LogStream,
    /// Lines still to write (tail without follow); `None` is unlimited.
    lines_left: Option<u64>,
    /// Bytes still to write; `None` is unlimited.
    bytes_left: Option<u64>,
    open: [Open; 2],
    /// Nothing more will be written.
    done: bool,
}

impl Decoder {
    fn new(opts: &LogOptions) -> Self {
        let lines_left = opts.tail_lines.filter(|_| !opts.follow).map(|n| n.max(0) as u64);
        let bytes_left = opts.limit_bytes.map(|n| n.max(0) as u64);
        Decoder {
            timestamps: opts.timestamps,
            since: opts.since,
            stream: opts.stream,
            lines_left,
            bytes_left,
            open: Default::default(),
            done: lines_left == Some(0) || bytes_left == Some(0),
        }
    }

    /// Decodes one file line (with its newline, if it has one) and appends what it shows to `out`.
    fn line(&mut self, line: &[u8], out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        let entry = match parse(line) {
            Ok(entry) => entry,
            Err(e) => {
                tracing::debug!("skipping a malformed container log line: {e}: {:?}", String::from_utf8_lossy(line));
                self.count_line();
                return;
            }
        };
        let open = &mut self.open[entry.source as usize];
        let continued = open.partial;
        if !continued {
            let wanted = match self.stream {
                LogStream::All => true,
                LogStream::Stdout => entry.source == Source::Stdout,
                LogStream::Stderr => entry.source == Source::Stderr,
            };
            open.shown = wanted && self.since.is_none_or(|since| entry.time >= since);
        }
        open.partial = entry.partial;
        if open.shown {
            if self.timestamps && !continued {
                let stamp = entry.time.to_rfc3339_opts(SecondsFormat::Nanos, true);
                self.write(stamp.as_bytes(), out);
                self.write(b" ", out);
            }
            self.write(entry.content, out);
        }
        if !entry.partial {
            self.count_line();
        }
    }

    fn write(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        let take =
            self.bytes_left.map_or(data.len(), |left| data.len().min(usize::try_from(left).unwrap_or(usize::MAX)));
        out.extend_from_slice(&data[..take]);
        if let Some(left) = &mut self.bytes_left {
            *left -= take as u64;
            self.done |= *left == 0;
        }
    }

    fn count_line(&mut self) {
        if let Some(left) = &mut self.lines_left {
            *left = left.saturating_sub(1);
            self.done |= *left == 0;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reading and following
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading; at the end of the file, wait for more.
    Live,
    /// `path` is a new file: finish the old one, then switch.
    Rotated,
    /// The container has ended: read what is left, then stop.
    Draining,
}

/// The state behind the stream [`read`] returns.
struct Reader {
    path: PathBuf,
    follow: bool,
    tail: Option<u64>,
    alive: Box<dyn Fn() -> bool + Send + Sync>,
    /// The open file and its (device, inode).
    file: Option<(tokio::fs::File, (u64, u64))>,
    phase: Phase,
    buf: Vec<u8>,
    /// The start of a line whose newline has not been read yet.
    line: Vec<u8>,
    /// Dropping an over-long line up to its newline.
    overlong: bool,
    decoder: Decoder,
}

fn status_of<'a>(pod: &'a Pod, container: &str) -> Option<&'a ContainerStatus> {
    let status = pod.status.as_ref()?;
    status
        .container_statuses
        .iter()
        .chain(status.init_container_statuses.iter())
        .chain(status.ephemeral_container_statuses.iter())
        .flatten()
        .find(|s| s.name == container)
}

/// Which run of the container to read (its restart count names the log file), as kubelet's
/// `validateContainerLogStatus` picks it: the running or finished one; while it waits to restart,
/// the last one that ran; `previous` asks for the run before. The error is the message a client sees.
pub fn which_run(pod: &Pod, container: &str, previous: bool) -> Result<i32, String> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let status = status_of(pod, container);
    let state = status.and_then(|s| s.state.clone()).unwrap_or_default();
    let last_ran = status.and_then(|s| s.last_state.as_ref()).and_then(|l| l.terminated.as_ref()).is_some();
    let count = status.map_or(0, |s| s.restart_count);
    if previous {
        if !last_ran {
            return Err(format!("previous terminated container \"{container}\" in pod \"{name}\" not found"));
        }
        // While waiting, lastState is the newest run; otherwise the one before the current.
        return Ok(if state.waiting.is_some() { count } else { count - 1 });
    }
    if state.running.is_some() || state.terminated.is_some() || (state.waiting.is_some() && last_ran) {
        return Ok(count);
    }
    let reason = state.waiting.and_then(|w| w.reason).unwrap_or_else(|| "ContainerCreating".into());
    Err(format!("container \"{container}\" in pod \"{name}\" is waiting to start: {reason}"))
}

/// Whether the run of `container` that `pod` showed running (`container_id`) still runs in `now`.
pub fn still_running(now: &Pod, uid: &str, container: &str, container_id: Option<&str>) -> bool {
    now.metadata.uid.as_deref() == Some(uid)
        && status_of(now, container).is_some_and(|s| {
            s.container_id.as_deref() == container_id && s.state.as_ref().is_some_and(|st| st.running.is_some())
        })
}

/// The container ID of the run `pod` shows for `container`.
pub fn container_id(pod: &Pod, container: &str) -> Option<String> {
    status_of(pod, container).and_then(|s| s.container_id.clone())
}

/// Streams a container's CRI log file as kubelet's `ReadLogs` writes it: the content of each line
/// (preceded by its timestamp and a space with `timestamps`), partial chunks joined, filtered by
/// `since` and `stream`, the last `tail_lines` lines only, at most `limit_bytes` bytes; malformed
/// lines are skipped. With `follow`, it waits for new data (polling every 250 ms) until `alive()`
/// is false and the file is drained, and carries on across rotations: once a new file appears at
/// `path`, the old one is read to its end and the new one from its start.
pub fn read(
    path: PathBuf,
    opts: LogOptions,
    alive: impl Fn() -> bool + Send + Sync + 'static,
) -> impl futures::Stream<Item = io::Result<Bytes>> + Send + 'static {
    let reader = Reader {
        path,
        follow: opts.follow,
        tail: opts.tail_lines.map(|n| n.max(0) as u64),
        alive: Box::new(alive),
        file: None,
        phase: Phase::Live,
        buf: vec![0; READ_SIZE],
        line: Vec::new(),
        overlong: false,
        decoder: Decoder::new(&opts),
    };
    futures::stream::unfold(Some(reader), |state| async move {
        let mut reader = state?;
        match reader.next().await {
            Ok(Some(bytes)) => Some((Ok(bytes), Some(reader))),
            Ok(None) => None,
            Err(e) => Some((Err(e), None)),
        }
    })
}

impl Reader {
    /// The next piece of output; `None` at the end.
    async fn next(&mut self) -> io::Result<Option<Bytes>> {
        let mut out = Vec::new();
        loop {
            if self.decoder.done {
                return Ok(None);
            }
            let Some((file, id)) = &mut self.file else {
                self.file = Some(self.open(self.tail).await?);
                continue;
            };
            let n = file.read(&mut self.buf).await.map_err(|e| context(e, "failed to read log file", &self.path))?;
            if n > 0 {
                self.feed(n, &mut out);
                if !out.is_empty() {
                    return Ok(Some(out.into()));
                }
                continue;
            }
            if !self.follow {
                // Upstream writes a last line that lacks its newline too.
                self.finish_line(&mut out);
                self.decoder.done = true;
                return Ok((!out.is_empty()).then(|| out.into()));
            }
            match self.phase {
                Phase::Draining => return Ok(None),
                Phase::Rotated => {
                    match self.open(None).await {
                        Ok(new) => {
                            tracing::debug!("following the rotated container log {}", self.path.display());
                            self.finish_line(&mut out);
                            self.file = Some(new);
                        }
                        // Rotated again in between: keep the old file until the next check.
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => return Err(e),
                    }
                    self.phase = Phase::Live;
                    if !out.is_empty() {
                        return Ok(Some(out.into()));
                    }
                }
                Phase::Live => {
                    let current = *id;
                    if tokio::fs::metadata(&self.path).await.is_ok_and(|m| (m.dev(), m.ino()) != current) {
                        // Read the old file once more before switching: writes may have landed since.
                        self.phase = Phase::Rotated;
                    } else if !(self.alive)() {
                        self.phase = Phase::Draining;
                    } else {
                        tokio::time::sleep(POLL).await;
                    }
                }
            }
        }
    }

    /// Opens `path`, positioned where the last `tail` lines start (at the start without it).
    async fn open(&self, tail: Option<u64>) -> io::Result<(tokio::fs::File, (u64, u64))> {
        let path = self.path.clone();
        let opened = tokio::task::spawn_blocking(move || {
            let mut file = File::open(&path).map_err(|e| context(e, "failed to open log file", &path))?;
            let meta = file.metadata()?;
            if let Some(n) = tail {
                let start = tail_start(&file, n).map_err(|e| context(e, "failed to tail log file", &path))?;
                file.seek(SeekFrom::Start(start))?;
            }
            Ok::<_, io::Error>((tokio::fs::File::from_std(file), (meta.dev(), meta.ino())))
        });
        opened.await.map_err(io::Error::other)?
    }

    /// Splits the `n` bytes just read into lines and decodes the complete ones.
    fn feed(&mut self, n: usize, out: &mut Vec<u8>) {
        let mut rest = &self.buf[..n];
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            let (chunk, after) = rest.split_at(i + 1);
            rest = after;
            if self.overlong {
                self.overlong = false;
            } else if self.line.is_empty() {
                self.decoder.line(chunk, out);
            } else {
                self.line.extend_from_slice(chunk);
                self.decoder.line(&self.line, out);
                self.line.clear();
            }
        }
        if !self.overlong {
            self.line.extend_from_slice(rest);
            if self.line.len() > MAX_LINE {
                tracing::debug!(
                    "skipping a container log line longer than {MAX_LINE} bytes in {}",
                    self.path.display()
                );
                self.line = Vec::new();
                self.overlong = true;
            }
        }
    }

    /// Decodes a line left without its newline at the end of a file.
    fn finish_line(&mut self, out: &mut Vec<u8>) {
        if !self.line.is_empty() {
            tracing::debug!("incomplete line at the end of container log {}", self.path.display());
            self.decoder.line(&self.line, out);
            self.line.clear();
        }
        self.overlong = false;
    }
}

fn context(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {:?}: {e}", path.display().to_string()))
}

// ---------------------------------------------------------------------------------------------
// Rotation
// ---------------------------------------------------------------------------------------------

/// Rotates a container's log file as kubelet's container log manager does, once it has reached
/// `max_size`: older rotated files beyond `max_files - 2` are removed and the rest gzipped, the live
/// file is renamed to `<path>.<YYYYMMDD-HHMMSS>` (UTC) and `reopen` makes the runtime start a new one
/// (CRI `ReopenContainerLog`); if that fails the rename is undone. At most `max_files` files remain,
/// counting the live one. A missing file is reopened too. Returns whether the file was rotated.
pub async fn rotate<'a>(
    path: &Path,
    max_size: u64,
    max_files: usize,
    reopen: impl FnOnce() -> BoxFuture<'a, anyhow::Result<()>>,
) -> anyhow::Result<bool> {
    rotate_at(path, max_size, max_files, Utc::now(), reopen).await
}

async fn rotate_at<'a>(
    path: &Path,
    max_size: u64,
    max_files: usize,
    now: DateTime<Utc>,
    reopen: impl FnOnce() -> BoxFuture<'a, anyhow::Result<()>>,
) -> anyhow::Result<bool> {
    anyhow::ensure!(max_files > 1, "invalid MaxFiles {max_files}, must be > 1");
    let size = match tokio::fs::metadata(path).await {
        Ok(meta) => meta.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            reopen().await.with_context(|| {
                format!("container log {} doesn't exist, reopen container log failed", path.display())
            })?;
            return Ok(false);
        }
        Err(e) => return Err(e).with_context(|| format!("failed to stat container log {}", path.display())),
    };
    if size < max_size {
        return Ok(false);
    }

    let live = path.to_owned();
    tokio::task::spawn_blocking(move || prune(&live, max_files)).await??;

    let mut rotated = path.as_os_str().to_owned();
    rotated.push(format!(".{}", now.format(ROTATED_FORMAT)));
    let rotated = PathBuf::from(rotated);
    tokio::fs::rename(path, &rotated)
        .await
        .with_context(|| format!("failed to rotate log {} to {}", path.display(), rotated.display()))?;
    if let Err(e) = reopen().await {
        // Put the file back so that the next round tries again.
        if let Err(undo) = tokio::fs::rename(&rotated, path).await {
            tracing::error!("failed to rename rotated log {} back to {}: {undo}", rotated.display(), path.display());
        }
        return Err(e.context(format!("failed to reopen container log {}", path.display())));
    }
    tracing::debug!("rotated container log {} to {}", path.display(), rotated.display());
    Ok(true)
}

/// Makes room for one more rotated file next to `live`: removes leftovers of failed rotations and
/// the oldest files so that `max_files - 2` remain, and gzips those not compressed yet.
fn prune(live: &Path, max_files: usize) -> anyhow::Result<()> {
    let dir = live.parent().context("container log path has no parent directory")?;
    let prefix = format!("{}.", live.file_name().context("container log path has no file name")?.to_string_lossy());
    let mut rotated: Vec<String> = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("failed to list {}", dir.display()))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) {
            rotated.push(name);
        }
    }
    // A `.tmp` is an unfinished compression; a file next to its `.gz` was compressed but not removed.
    let (unused, mut in_use): (Vec<String>, Vec<String>) = rotated.iter().cloned().partition(|name| {
        name.ends_with(TMP_SUFFIX) || rotated.iter().any(|other| *other == format!("{name}{GZ_SUFFIX}"))
    });
    in_use.sort();
    let excess = in_use.len().saturating_sub(max_files - 2);
    for name in unused.iter().chain(&in_use[..excess]) {
        let file = dir.join(name);
        fs::remove_file(&file).with_context(|| format!("failed to remove old log {}", file.display()))?;
    }
    for name in &in_use[excess..] {
        if !name.ends_with(GZ_SUFFIX) {
            let file = dir.join(name);
            compress(&file).with_context(|| format!("failed to compress log {}", file.display()))?;
        }
    }
    Ok(())
}

/// Gzips `log` into `log.gz` (written as `log.tmp` first) and removes `log`.
fn compress(log: &Path) -> anyhow::Result<()> {
    let mut src = File::open(log)?;
    let mode = src.metadata()?.permissions().mode();
    let tmp = with_suffix(log, TMP_SUFFIX);
    let result = (|| -> io::Result<()> {
        let dst = OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(&tmp)?;
        let mut gz = flate2::write::GzEncoder::new(dst, flate2::Compression::default());
        io::copy(&mut src, &mut gz)?;
        gz.finish()?;
        fs::rename(&tmp, with_suffix(log, GZ_SUFFIX))
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(e.into());
    }
    fs::remove_file(log)?;
    Ok(())
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests;
