use std::io::{Read as _, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use futures::{FutureExt as _, StreamExt as _};

use super::*;

/// `2024-01-01T00:00:<sec>.000000001Z <stream> <tag> <content>\n`.
fn cri(sec: u32, stream: &str, tag: &str, content: &str) -> String {
    format!("2024-01-01T00:00:{sec:02}.000000001Z {stream} {tag} {content}\n")
}

fn at(sec: u32) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(&format!("2024-01-01T00:00:{sec:02}Z")).unwrap().with_timezone(&Utc)
}

fn write_log(dir: &tempfile::TempDir, text: &str) -> PathBuf {
    let path = dir.path().join("0.log");
    fs::write(&path, text).unwrap();
    path
}

fn append(path: &Path, text: &str) {
    fs::OpenOptions::new().append(true).open(path).unwrap().write_all(text.as_bytes()).unwrap();
}

async fn read_all(path: &Path, opts: LogOptions) -> String {
    let chunks: Vec<_> = read(path.to_owned(), opts, || false).collect().await;
    let bytes: Vec<u8> = chunks.into_iter().flat_map(|c| c.unwrap().to_vec()).collect();
    String::from_utf8(bytes).unwrap()
}

fn decode(opts: &LogOptions, lines: &[String]) -> String {
    let mut decoder = Decoder::new(opts);
    let mut out = Vec::new();
    for line in lines {
        decoder.line(line.as_bytes(), &mut out);
    }
    String::from_utf8(out).unwrap()
}

#[test]
fn parses_full_partial_and_stderr_lines() {
    let full = parse(b"2016-10-06T00:17:09.669794202Z stdout F some text\n").unwrap();
    assert_eq!(full.source, Source::Stdout);
    assert!(!full.partial);
    assert_eq!(full.content, b"some text\n");
    assert_eq!(full.time.to_rfc3339_opts(SecondsFormat::Nanos, true), "2016-10-06T00:17:09.669794202Z");

    let partial = parse(b"2016-10-06T00:17:09.669794202Z stderr P part\n").unwrap();
    assert_eq!(partial.source, Source::Stderr);
    assert!(partial.partial);
    assert_eq!(partial.content, b"part");

    // Extra tags after `:` are allowed; content keeps its inner spaces.
    let tagged = parse(b"2016-10-06T00:17:09Z stdout P:x a  b\n").unwrap();
    assert!(tagged.partial);
    assert_eq!(tagged.content, b"a  b");
    assert_eq!(parse(b"2016-10-06T00:17:09Z stdout F \n").unwrap().content, b"\n");
}

#[test]
fn rejects_malformed_lines() {
    assert_eq!(parse(b"garbage\n").unwrap_err(), "timestamp is not found");
    assert!(parse(b"yesterday stdout F x\n").unwrap_err().starts_with("unexpected timestamp format"));
    assert_eq!(parse(b"2016-10-06T00:17:09Z stdin F x\n").unwrap_err(), "unexpected stream type \"stdin\"");
    assert_eq!(parse(b"2016-10-06T00:17:09Z stdout\n").unwrap_err(), "stream type is not found");
    assert_eq!(parse(b"2016-10-06T00:17:09Z stdout F\n").unwrap_err(), "log tag is not found");
}

#[test]
fn joins_partials_and_stamps_each_line_once() {
    let lines = [
        cri(1, "stdout", "P", "hel"),
        cri(2, "stdout", "P", "lo "),
        cri(3, "stdout", "F", "world"),
        cri(4, "stderr", "F", "oops"),
    ];
    assert_eq!(decode(&LogOptions::default(), &lines), "hello world\noops\n");
    let stamped = LogOptions { timestamps: true, ..Default::default() };
    assert_eq!(
        decode(&stamped, &lines),
        "2024-01-01T00:00:01.000000001Z hello world\n2024-01-01T00:00:04.000000001Z oops\n"
    );
}

#[test]
fn keeps_partial_state_per_stream_and_skips_malformed() {
    let lines = [
        cri(1, "stdout", "P", "a"),
        cri(2, "stderr", "F", "err"),
        "not a log line\n".to_string(),
        cri(3, "stdout", "F", "b"),
    ];
    let stamped = LogOptions { timestamps: true, ..Default::default() };
    // The stdout continuation gets no timestamp of its own, although stderr came in between.
    assert_eq!(decode(&stamped, &lines), "2024-01-01T00:00:01.000000001Z a2024-01-01T00:00:02.000000001Z err\nb\n");
    let stderr = LogOptions { stream: LogStream::Stderr, ..Default::default() };
    assert_eq!(decode(&stderr, &lines), "err\n");
    let stdout = LogOptions { stream: LogStream::Stdout, ..Default::default() };
    assert_eq!(decode(&stdout, &lines), "ab\n");
}

#[test]
fn since_filters_whole_lines() {
    let lines = [
        cri(1, "stdout", "F", "one"),
        cri(2, "stdout", "P", "tw"),
        cri(3, "stdout", "F", "o"),
        cri(4, "stdout", "F", "three"),
    ];
    let since = |sec| LogOptions { since: Some(at(sec)), ..Default::default() };
    // A line is kept or dropped as a whole, by the time of its first chunk.
    assert_eq!(decode(&since(2), &lines), "two\nthree\n");
    assert_eq!(decode(&since(3), &lines), "three\n");
    assert_eq!(decode(&since(5), &lines), "");
}

#[test]
fn limit_bytes_cuts_the_output() {
    let lines = [cri(1, "stdout", "F", "hello"), cri(2, "stdout", "F", "hello"), cri(3, "stdout", "F", "hello")];
    assert_eq!(decode(&LogOptions { limit_bytes: Some(8), ..Default::default() }, &lines), "hello\nhe");
    let stamped = LogOptions { limit_bytes: Some(33), timestamps: true, ..Default::default() };
    assert_eq!(decode(&stamped, &lines), "2024-01-01T00:00:01.000000001Z he");
}

#[tokio::test]
async fn reads_a_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    let text =
        [cri(1, "stdout", "F", "one"), "broken\n".into(), cri(2, "stderr", "F", "two"), cri(3, "stdout", "F", "three")];
    // A last line without its newline is still shown, as upstream does.
    let path = write_log(&dir, &format!("{}{}", text.concat(), cri(4, "stdout", "F", "four").trim_end()));
    assert_eq!(read_all(&path, LogOptions::default()).await, "one\ntwo\nthree\nfour");
    assert_eq!(read_all(&path, LogOptions { tail_lines: Some(1), ..Default::default() }).await, "three\n");
}

#[tokio::test]
async fn missing_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let chunks: Vec<_> = read(dir.path().join("nope.log"), LogOptions::default(), || false).collect().await;
    assert_eq!(chunks.len(), 1);
    let err = chunks.into_iter().next().unwrap().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    assert!(err.to_string().starts_with("failed to open log file"), "{err}");
}

#[tokio::test]
async fn tails_a_multi_block_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::new();
    let mut count = 0;
    while text.len() < 2 << 20 {
        text.push_str(&cri(count % 60, "stdout", "F", &format!("line {count}")));
        count += 1;
    }
    let path = write_log(&dir, &text);
    let tail = |n| LogOptions { tail_lines: Some(n), ..Default::default() };
    let expected: String = (count - 5..count).map(|i| format!("line {i}\n")).collect();
    assert_eq!(read_all(&path, tail(5)).await, expected);
    assert_eq!(read_all(&path, tail(0)).await, "");
    let file = File::open(&path).unwrap();
    assert_eq!(tail_start(&file, count as u64).unwrap(), 0);
    assert_eq!(tail_start(&file, 0).unwrap(), text.len() as u64);
    assert_eq!(read_all(&path, tail(count as i64 + 10)).await.lines().count(), count as usize);
}

#[tokio::test]
async fn tail_counts_a_split_line_once() {
    let dir = tempfile::tempdir().unwrap();
    let big = "x".repeat(TAIL_BLOCK);
    let text = [
        cri(1, "stdout", "F", "first"),
        cri(2, "stdout", "F", "second"),
        cri(3, "stdout", "P", &big),
        cri(3, "stdout", "P", "-mid-"),
        cri(3, "stdout", "F", "end"),
        // A chunk of a line still being written is not a complete line.
        cri(4, "stdout", "P", "unfinished"),
    ];
    let path = write_log(&dir, &text.concat());
    let got = read_all(&path, LogOptions { tail_lines: Some(2), ..Default::default() }).await;
    assert_eq!(got, format!("second\n{big}-mid-end\n"));
}

/// Collects a followed stream in the background.
fn follow(path: &Path, alive: Arc<AtomicBool>) -> tokio::task::JoinHandle<String> {
    let opts = LogOptions { follow: true, ..Default::default() };
    let stream = read(path.to_owned(), opts, move || alive.load(Ordering::SeqCst));
    tokio::spawn(async move {
        let chunks: Vec<_> = stream.collect().await;
        String::from_utf8(chunks.into_iter().flat_map(|c| c.unwrap().to_vec()).collect()).unwrap()
    })
}

async fn pause() {
    tokio::time::sleep(POLL * 2).await;
}

#[tokio::test]
async fn follow_picks_up_new_lines_until_the_container_ends() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(&dir, &cri(1, "stdout", "F", "one"));
    let alive = Arc::new(AtomicBool::new(true));
    let task = follow(&path, alive.clone());
    pause().await;
    append(&path, &cri(2, "stdout", "P", "tw"));
    pause().await;
    append(&path, &cri(3, "stdout", "F", "o"));
    pause().await;
    assert!(!task.is_finished());
    alive.store(false, Ordering::SeqCst);
    let got = tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
    assert_eq!(got, "one\ntwo\n");
}

#[tokio::test]
async fn follow_with_tail_starts_at_the_last_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(&dir, &[cri(1, "stdout", "F", "one"), cri(2, "stdout", "F", "two")].concat());
    let opts = LogOptions { follow: true, tail_lines: Some(1), ..Default::default() };
    let alive = Arc::new(AtomicBool::new(true));
    let flag = alive.clone();
    let mut stream = Box::pin(read(path.clone(), opts, move || flag.load(Ordering::SeqCst)));
    assert_eq!(stream.next().await.unwrap().unwrap(), "two\n");
    append(&path, &cri(3, "stdout", "F", "three"));
    assert_eq!(stream.next().await.unwrap().unwrap(), "three\n");
    alive.store(false, Ordering::SeqCst);
    assert!(tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap().is_none());
}

#[tokio::test]
async fn follow_survives_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(&dir, &cri(1, "stdout", "F", "one"));
    let alive = Arc::new(AtomicBool::new(true));
    let task = follow(&path, alive.clone());
    pause().await;
    let old = dir.path().join("0.log.20240101-000000");
    fs::rename(&path, &old).unwrap();
    // The runtime still writes to the old file until it reopens.
    append(&old, &cri(2, "stdout", "F", "two"));
    pause().await;
    fs::write(&path, cri(3, "stdout", "F", "three")).unwrap();
    pause().await;
    append(&path, &cri(4, "stdout", "F", "four"));
    pause().await;
    alive.store(false, Ordering::SeqCst);
    let got = tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
    assert_eq!(got, "one\ntwo\nthree\nfour\n");
}

#[tokio::test]
async fn follow_of_an_ended_container_stops_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(&dir, &[cri(1, "stdout", "F", "one"), cri(2, "stderr", "F", "two")].concat());
    let got = tokio::time::timeout(Duration::from_secs(5), follow(&path, Arc::new(AtomicBool::new(false))))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, "one\ntwo\n");
}

// ---------------------------------------------------------------------------------------------
// Rotation
// ---------------------------------------------------------------------------------------------

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

fn gunzip(path: &Path) -> String {
    let mut text = String::new();
    flate2::read::GzDecoder::new(File::open(path).unwrap()).read_to_string(&mut text).unwrap();
    text
}

#[tokio::test]
async fn small_files_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(&dir, "short\n");
    let reopened = AtomicUsize::new(0);
    let reopen =
        || async { Ok::<_, anyhow::Error>(()) }.inspect(|_| _ = reopened.fetch_add(1, Ordering::SeqCst)).boxed();
    assert!(!rotate(&path, 100, 5, reopen).await.unwrap());
    assert_eq!(reopened.load(Ordering::SeqCst), 0);
    assert_eq!(names(dir.path()), ["0.log"]);
}

#[tokio::test]
async fn rotates_compresses_and_keeps_max_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(&dir, "generation 0\n");
    for generation in 1..=4u32 {
        let reopen = || {
            let path = path.clone();
            async move {
                tokio::fs::write(&path, format!("generation {generation}\n")).await?;
                Ok(())
            }
            .boxed()
        };
        assert!(rotate_at(&path, 10, 3, at(generation), reopen).await.unwrap());
    }
    // The live file, the newest rotated one as it is, and one older one compressed.
    assert_eq!(names(dir.path()), ["0.log", "0.log.20240101-000003.gz", "0.log.20240101-000004"]);
    assert_eq!(fs::read_to_string(&path).unwrap(), "generation 4\n");
    assert_eq!(fs::read_to_string(dir.path().join("0.log.20240101-000004")).unwrap(), "generation 3\n");
    assert_eq!(gunzip(&dir.path().join("0.log.20240101-000003.gz")), "generation 2\n");
}

#[tokio::test]
async fn reopen_failure_restores_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(&dir, "a long enough line\n");
    let err = rotate_at(&path, 10, 5, at(1), || async { anyhow::bail!("runtime is down") }.boxed()).await.unwrap_err();
    assert_eq!(format!("{err}"), format!("failed to reopen container log {}", path.display()));
    assert_eq!(format!("{:#}", err).rsplit(": ").next(), Some("runtime is down"));
    assert_eq!(names(dir.path()), ["0.log"]);
    assert_eq!(fs::read_to_string(&path).unwrap(), "a long enough line\n");
}

#[tokio::test]
async fn missing_log_is_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("0.log");
    let reopen = || {
        let path = path.clone();
        async move { Ok(tokio::fs::write(&path, "").await?) }.boxed()
    };
    assert!(!rotate(&path, 10, 5, reopen).await.unwrap());
    assert_eq!(names(dir.path()), ["0.log"]);
    assert!(rotate(&path, 10, 1, || async { Ok(()) }.boxed()).await.unwrap_err().to_string().contains("must be > 1"));
}

#[tokio::test]
async fn leftovers_of_failed_rotations_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(&dir, "a long enough line\n");
    let old = dir.path().join("0.log.20240101-000001");
    fs::write(&old, "old\n").unwrap();
    fs::write(dir.path().join("0.log.20240101-000001.gz"), b"").unwrap();
    fs::write(dir.path().join("0.log.20240101-000002"), "older\n").unwrap();
    fs::write(dir.path().join("0.log.20240101-000002.tmp"), b"partial").unwrap();
    fs::write(dir.path().join("other.log"), "untouched\n").unwrap();
    assert!(rotate_at(&path, 10, 5, at(3), || async { Ok(()) }.boxed()).await.unwrap());
    assert_eq!(
        names(dir.path()),
        ["0.log.20240101-000001.gz", "0.log.20240101-000002.gz", "0.log.20240101-000003", "other.log"]
    );
    assert_eq!(gunzip(&dir.path().join("0.log.20240101-000002.gz")), "older\n");
}

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

fn query(pairs: &[(&str, &str)]) -> Result<LogOptions, LogOptionsError> {
    let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    LogOptions::from_query(&pairs, at(30))
}

fn message(pairs: &[(&str, &str)]) -> String {
    query(pairs).unwrap_err().to_string()
}

#[test]
fn decodes_options() {
    assert_eq!(query(&[]).unwrap(), LogOptions::default());
    let opts = query(&[
        ("container", "app"),
        ("follow", "true"),
        ("previous", "1"),
        ("timestamps", ""),
        ("tailLines", "10"),
        ("limitBytes", "100"),
        ("sinceSeconds", "10"),
        ("insecureSkipTLSVerifyBackend", "true"),
        ("pretty", "x"),
    ])
    .unwrap();
    assert_eq!(
        opts,
        LogOptions {
            container: Some("app".into()),
            follow: true,
            previous: true,
            timestamps: true,
            tail_lines: Some(10),
            since: Some(at(20)),
            limit_bytes: Some(100),
            stream: LogStream::All,
        }
    );
    let off = query(&[("follow", "FALSE"), ("previous", "0"), ("timestamps", "false"), ("follow", "true")]).unwrap();
    assert!(!off.follow && !off.previous && !off.timestamps);
    assert_eq!(query(&[("sinceTime", "2024-01-01T00:00:05Z")]).unwrap().since, Some(at(5)));
    assert_eq!(query(&[("stream", "Stderr")]).unwrap().stream, LogStream::Stderr);
    assert_eq!(query(&[("container", "")]).unwrap().container, None);
}

#[test]
fn validation_messages_match_upstream() {
    assert_eq!(message(&[("tailLines", "-1")]), "tailLines: Invalid value: -1: must be greater than or equal to 0");
    assert_eq!(message(&[("limitBytes", "0")]), "limitBytes: Invalid value: 0: must be greater than 0");
    assert_eq!(message(&[("sinceSeconds", "0")]), "sinceSeconds: Invalid value: 0: must be greater than 0");
    assert_eq!(
        message(&[("sinceSeconds", "5"), ("sinceTime", "2024-01-01T00:00:05Z")]),
        ": Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified"
    );
    assert_eq!(
        message(&[("stream", "Both")]),
        "stream: Unsupported value: \"Both\": supported values: \"Stdout\", \"Stderr\", \"All\""
    );
    assert_eq!(
        message(&[("stream", "Stdout"), ("tailLines", "3")]),
        ": Forbidden: `tailLines` and specific `stream` are mutually exclusive for now"
    );
    assert!(query(&[("stream", "All"), ("tailLines", "3")]).is_ok());
    assert_eq!(
        message(&[("tailLines", "-1"), ("limitBytes", "-2")]),
        "[tailLines: Invalid value: -1: must be greater than or equal to 0, \
         limitBytes: Invalid value: -2: must be greater than 0]"
    );
    assert!(matches!(query(&[("tailLines", "-1")]), Err(LogOptionsError::Invalid(errs)) if errs.len() == 1));
}

#[test]
fn undecodable_values_are_bad_requests() {
    let bad = query(&[("tailLines", "ten")]).unwrap_err();
    assert!(matches!(bad, LogOptionsError::BadRequest(_)));
    assert_eq!(bad.to_string(), "strconv.ParseInt: parsing \"ten\": invalid syntax");
    assert_eq!(
        message(&[("limitBytes", "99999999999999999999")]),
        "strconv.ParseInt: parsing \"99999999999999999999\": value out of range"
    );
    assert!(
        message(&[("sinceTime", "yesterday")])
            .starts_with("parsing time \"yesterday\" as \"2006-01-02T15:04:05Z07:00\"")
    );
}

#[tokio::test]
async fn long_lines_stream_in_chunks_and_corrupt_ones_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let chunk = "y".repeat(16 << 10);
    let mut text: String = (0..64).map(|_| cri(1, "stdout", "P", &chunk)).collect();
    text.push_str(&cri(1, "stdout", "F", "!"));
    // One file line far longer than containerd ever writes.
    text.push_str(&format!("{}\n", "z".repeat(MAX_LINE * 3)));
    text.push_str(&cri(2, "stderr", "F", "after"));
    let path = write_log(&dir, &text);
    let got = read_all(&path, LogOptions::default()).await;
    assert_eq!(got.len(), 64 * chunk.len() + "!\nafter\n".len());
    assert!(got.ends_with("y!\nafter\n"));
}

#[test]
fn timestamps_keep_their_offset() {
    let line = "2024-01-01T01:00:00.5+01:00 stdout F hi\n".to_string();
    let stamped = LogOptions { timestamps: true, ..Default::default() };
    assert_eq!(decode(&stamped, std::slice::from_ref(&line)), "2024-01-01T01:00:00.500000000+01:00 hi\n");
    // The comparison with `since` is by instant, whatever the offset.
    assert_eq!(decode(&LogOptions { since: Some(at(0)), ..Default::default() }, std::slice::from_ref(&line)), "hi\n");
    assert_eq!(decode(&LogOptions { since: Some(at(1)), ..Default::default() }, &[line]), "");
}
