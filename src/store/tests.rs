use super::*;
use serde_json::json;

fn obj(name: &str) -> Value {
    json!({"metadata": {"name": name}, "data": {"k": "v"}})
}

fn open(dir: &Path) -> Store {
    Store::open(dir, Options { cache_bytes: 1 << 20, history: 4, ..Default::default() }).expect("open store")
}

#[tokio::test]
async fn writes_get_increasing_revisions_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let last = {
        let store = open(dir.path());
        let a = store.write("c/a".into(), Precondition::Absent, Op::Put(obj("a"))).await.unwrap();
        let b = store.write("c/b".into(), Precondition::Absent, Op::Put(obj("b"))).await.unwrap();
        assert!(b.rv > a.rv);
        let v: Value = serde_json::from_slice(&b.data).unwrap();
        assert_eq!(v["metadata"]["resourceVersion"], b.rv.to_string());
        store.write("c/a".into(), Precondition::Revision(a.rv), Op::Delete(obj("a"))).await.unwrap();
        store.revision()
    };
    // The writer thread exits once the store is dropped; wait for sled's lock to be released.
    let store = loop {
        match Store::open(dir.path(), Options::default()) {
            Ok(s) => break s,
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    };
    assert_eq!(store.revision(), last);
    assert!(store.get("c/a").is_none());
    assert!(store.get("c/b").is_some());
    let next = store.write("c/c".into(), Precondition::Absent, Op::Put(obj("c"))).await.unwrap();
    assert!(next.rv > last);
}

#[tokio::test]
async fn preconditions_are_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let a = store.write("c/a".into(), Precondition::Absent, Op::Put(obj("a"))).await.unwrap();
    assert!(matches!(
        store.write("c/a".into(), Precondition::Absent, Op::Put(obj("a"))).await,
        Err(Error::AlreadyExists)
    ));
    assert!(matches!(
        store.write("c/a".into(), Precondition::Revision(a.rv + 100), Op::Put(obj("a"))).await,
        Err(Error::Conflict { current }) if current == a.rv
    ));
    assert!(matches!(
        store.write("c/x".into(), Precondition::Revision(1), Op::Put(obj("x"))).await,
        Err(Error::NotFound)
    ));
}

#[tokio::test]
async fn concurrent_creates_of_one_key_have_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let s = store.clone();
            tokio::spawn(async move { s.write("c/same".into(), Precondition::Absent, Op::Put(obj("same"))).await })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        if t.await.unwrap().is_ok() {
            ok += 1;
        }
    }
    assert_eq!(ok, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_share_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let s = store.clone();
            tokio::spawn(async move { s.write(format!("c/{i}"), Precondition::Absent, Op::Put(obj("x"))).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let stats = store.stats();
    assert_eq!(stats.writes, 64);
    assert!(stats.flushes < 64, "64 concurrent writes took {} flushes", stats.flushes);
}

#[tokio::test]
async fn list_is_prefix_bounded_and_paginates() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    for name in ["a", "b", "c"] {
        store.write(format!("pods/ns1/{name}"), Precondition::Absent, Op::Put(obj(name))).await.unwrap();
    }
    store.write("pods/ns2/z".into(), Precondition::Absent, Op::Put(obj("z"))).await.unwrap();
    let page = store.list("pods/ns1/", None);
    assert_eq!(page.items.len(), 3);
    let rest = store.list("pods/ns1/", Some(&page.items[1].0));
    assert_eq!(rest.items.len(), 1);
    assert_eq!(rest.items[0].0, "pods/ns1/c");
    assert_eq!(store.list("pods/", None).items.len(), 4);
}

#[tokio::test]
async fn watch_resumes_and_expires() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let start = store.revision();
    let mut sub = store.watch(start).unwrap();
    let a = store.write("c/a".into(), Precondition::Absent, Op::Put(obj("a"))).await.unwrap();
    let e = sub.next().await.unwrap();
    assert_eq!((e.rv, e.kind), (a.rv, EventType::Added));

    // Resume from the middle of the history.
    let b = store.write("c/a".into(), Precondition::Revision(a.rv), Op::Put(obj("a"))).await.unwrap();
    let mut resumed = store.watch(a.rv).unwrap();
    let e = resumed.next().await.unwrap();
    assert_eq!((e.rv, e.kind), (b.rv, EventType::Modified));
    assert_eq!(e.prev.as_ref().map(|p| p.rv), Some(a.rv));

    // The history keeps 4 events; older revisions are gone.
    let mut rv = b.rv;
    for _ in 0..5 {
        rv = store.write("c/a".into(), Precondition::Revision(rv), Op::Put(obj("a"))).await.unwrap().rv;
    }
    assert!(matches!(store.watch(start), Err(Error::TooOld { .. })));
}

#[tokio::test]
async fn list_and_watch_miss_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    store.write("c/a".into(), Precondition::Absent, Op::Put(obj("a"))).await.unwrap();
    let (listing, mut sub) = store.list_and_watch("c/");
    assert_eq!(listing.items.len(), 1);
    let b = store.write("c/b".into(), Precondition::Absent, Op::Put(obj("b"))).await.unwrap();
    let e = sub.next().await.unwrap();
    assert_eq!(e.rv, b.rv);
    assert_eq!(&*e.key, "c/b");
}

#[tokio::test]
async fn history_is_bounded_by_bytes_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        dir.path(),
        Options { cache_bytes: 1 << 20, history: 1000, history_bytes: 4096, ..Default::default() },
    )
    .unwrap();
    let start = store.revision();
    let big = json!({"metadata": {"name": "big"}, "data": {"k": "x".repeat(3000)}});
    let a = store.write("c/big".into(), Precondition::Absent, Op::Put(big.clone())).await.unwrap();
    store.write("c/big".into(), Precondition::Revision(a.rv), Op::Put(big)).await.unwrap();
    // Two 3 KB versions do not fit in 4 KB: the first was dropped from the history.
    assert!(matches!(store.watch(start), Err(Error::TooOld { .. })));
    assert!(store.watch(a.rv).is_ok());
}

/// Writes more events than the live channel holds, all at once so that they commit in few batches.
async fn burst(store: &Store, n: usize) {
    let writes = (0..n).map(|i| store.write(format!("c/{i}"), Precondition::Absent, Op::Put(obj(&i.to_string()))));
    for w in futures::future::join_all(writes).await {
        w.unwrap();
    }
}

#[tokio::test]
async fn a_watcher_behind_the_live_channel_catches_up_from_the_history() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options { history: 10_000, ..Default::default() }).unwrap();
    let (_, mut sub) = store.list_and_watch("c/");
    burst(&store, watch::LIVE_CAPACITY + 500).await;
    let mut last = 0;
    for _ in 0..watch::LIVE_CAPACITY + 500 {
        let e = sub.next().await.unwrap();
        assert!(e.rv > last, "revisions {last} then {}", e.rv);
        last = e.rv;
    }
    assert_eq!(last, store.revision());
}

#[tokio::test]
async fn a_watcher_behind_the_history_too_is_told_so() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options { history: 100, ..Default::default() }).unwrap();
    let (_, mut sub) = store.list_and_watch("c/");
    burst(&store, watch::LIVE_CAPACITY + 500).await;
    assert!(matches!(sub.next().await, Err(Error::TooOld { .. })));
}

/// A one-member etcd (Debian's `etcd-server`: `/usr/bin/etcd`, or `$ETCD`) on free loopback ports,
/// killed when dropped.
struct EtcdMember {
    child: std::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl EtcdMember {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (client, peer) = (free(), free());
        let (url, peer_url) = (format!("http://127.0.0.1:{client}"), format!("http://127.0.0.1:{peer}"));
        let etcd = std::env::var_os("ETCD").unwrap_or_else(|| "/usr/bin/etcd".into());
        let child = std::process::Command::new(&etcd)
            .arg("--data-dir")
            .arg(dir.path().join("etcd"))
            .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("default={peer_url}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("etcd-server is needed ({}): {e}", etcd.to_string_lossy()));
        let member = EtcdMember { child, url, _dir: dir };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
            assert!(std::time::Instant::now() < deadline, "etcd did not listen in 20s");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        member
    }

    async fn store(&self, history: usize) -> Store {
        self.store_with(Options { history, ..Default::default() }).await
    }

    async fn store_with(&self, options: Options) -> Store {
        let config = etcd::Config {
            endpoints: vec![self.url.clone()],
            ca_file: None,
            cert_file: None,
            key_file: None,
            prefix: etcd::DEFAULT_PREFIX.into(),
        };
        Store::open_etcd(config, options).await.unwrap()
    }
}

impl Drop for EtcdMember {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_writes_keep_preconditions_and_revisions() {
    let etcd = EtcdMember::start();
    let store = etcd.store(100).await;
    let a = store.write("c/a".into(), Precondition::Absent, Op::Put(obj("a"))).await.unwrap();
    let v: Value = serde_json::from_slice(&store.get("c/a").unwrap().data).unwrap();
    assert_eq!(v["metadata"]["resourceVersion"], a.rv.to_string(), "read your own write at its revision");
    assert!(matches!(
        store.write("c/a".into(), Precondition::Absent, Op::Put(obj("a"))).await,
        Err(Error::AlreadyExists)
    ));
    assert!(matches!(
        store.write("c/a".into(), Precondition::Revision(a.rv + 100), Op::Put(obj("a"))).await,
        Err(Error::Conflict { current }) if current == a.rv
    ));
    assert!(matches!(
        store.write("c/x".into(), Precondition::Revision(1), Op::Put(obj("x"))).await,
        Err(Error::NotFound)
    ));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let s = store.clone();
            tokio::spawn(async move { s.write("c/same".into(), Precondition::Absent, Op::Put(obj("same"))).await })
        })
        .collect();
    let mut winners = 0;
    for t in tasks {
        winners += usize::from(t.await.unwrap().is_ok());
    }
    assert_eq!(winners, 1);
    let b = store.write("c/a".into(), Precondition::Revision(a.rv), Op::Put(obj("a"))).await.unwrap();
    let gone = store.write("c/a".into(), Precondition::Revision(b.rv), Op::Delete(obj("a"))).await.unwrap();
    assert!(gone.rv > b.rv && b.rv > a.rv);
    assert!(store.get("c/a").is_none());
    let mut sub = store.watch(a.rv).unwrap();
    let kinds = [sub.next().await.unwrap(), sub.next().await.unwrap(), sub.next().await.unwrap()];
    let kinds: Vec<(String, EventType)> = kinds.iter().map(|e| (e.key.to_string(), e.kind)).collect();
    assert_eq!(
        kinds,
        [("c/same".into(), EventType::Added), ("c/a".into(), EventType::Modified), ("c/a".into(), EventType::Deleted)]
    );

    // Another store on the same etcd loads everything, and each sees the other's writes.
    let other = etcd.store(100).await;
    assert_eq!(other.list("c/", None).items.len(), 1);
    assert_eq!(other.revision(), store.revision());
    let (_, mut watched) = store.list_and_watch("c/");
    let theirs = other.write("c/theirs".into(), Precondition::Absent, Op::Put(obj("theirs"))).await.unwrap();
    let seen = watched.next().await.unwrap();
    assert_eq!((&*seen.key, seen.rv, seen.kind), ("c/theirs", theirs.rv, EventType::Added));
    assert_eq!(store.get("c/theirs").map(|o| o.rv), Some(theirs.rv));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_removes_expiring_keys_by_itself() {
    let etcd = EtcdMember::start();
    let ttl = std::time::Duration::from_secs(2);
    let store = etcd.store_with(Options { expiring: vec![("events/".into(), ttl)], ..Default::default() }).await;
    let (_, mut watched) = store.list_and_watch("");
    store.write("events/a".into(), Precondition::Absent, Op::Put(obj("a"))).await.unwrap();
    store.write("events/b".into(), Precondition::Absent, Op::Put(obj("b"))).await.unwrap();
    store.write("c/kept".into(), Precondition::Absent, Op::Put(obj("kept"))).await.unwrap();
    let mut gone = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
    while gone.len() < 2 {
        let event = tokio::time::timeout_at(deadline, watched.next()).await.expect("the events expire").unwrap();
        if event.kind == EventType::Deleted {
            gone.push(event.key.to_string());
        }
    }
    gone.sort();
    assert_eq!(gone, ["events/a", "events/b"]);
    assert!(store.get("events/a").is_none() && store.get("c/kept").is_some());
}

/// etcd gives several keys one revision (an expired lease's keys go in one deletion): a subscriber
/// gets every one of them, also when it lags behind the live channel in the middle of them.
#[tokio::test]
async fn every_event_of_one_revision_is_delivered_once() {
    let hub = Arc::new(Hub::new(0, 2 * watch::LIVE_CAPACITY, 1 << 30));
    let event = |rv: u64, key: &str| {
        let object = Arc::new(Object { rv, data: Bytes::from_static(b"{}") });
        Arc::new(Event { rv, kind: EventType::Deleted, key: key.into(), object, prev: None })
    };
    let keys_of = |sub: &mut watch::Subscription, n: usize| {
        let mut keys = Vec::new();
        for _ in 0..n {
            let next = futures::executor::block_on(sub.next()).unwrap();
            keys.push(next.key.to_string());
        }
        keys
    };
    let mut live = hub.subscribe(0).unwrap();
    hub.publish(vec![event(1, "a"), event(2, "b"), event(2, "c")]);
    assert_eq!(keys_of(&mut live, 3), ["a", "b", "c"]);
    let mut from_history = hub.subscribe(1).unwrap();
    assert_eq!(keys_of(&mut from_history, 2), ["b", "c"], "after revision 1: both of revision 2");

    // Reads one of revision 3's two events, then falls behind by more than the live channel holds.
    let mut slow = hub.subscribe(2).unwrap();
    hub.publish(vec![event(3, "d"), event(3, "e")]);
    assert_eq!(keys_of(&mut slow, 1), ["d"]);
    hub.publish((0..watch::LIVE_CAPACITY as u64 + 10).map(|i| event(4 + i, "x")).collect());
    assert_eq!(keys_of(&mut slow, 2), ["e", "x"], "the rest of revision 3, once, then on");
    let next = futures::executor::block_on(slow.next()).unwrap();
    assert_eq!(next.rv, 5);
}

/// What a crash leaves behind: a copy of the store's files taken while it runs.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        match entry.file_type().unwrap().is_dir() {
            true => copy_dir(&entry.path(), &target),
            false => drop(std::fs::copy(entry.path(), target).unwrap()),
        }
    }
}

#[tokio::test]
async fn deferred_updates_skip_the_flush_and_a_crash_loses_only_them() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options { cache_bytes: 1 << 20, deferred: vec!["lease/".into()], ..Default::default() };
    let store = Store::open(&dir.path().join("db"), options.clone()).unwrap();
    let renewal = |i: u32| json!({"metadata": {"name": "n"}, "renewed": i});
    // Creates are flushed as always.
    let mut lease = store.write("lease/n".into(), Precondition::Absent, Op::Put(renewal(0))).await.unwrap();
    let flushes = store.stats().flushes;
    for i in 1..=5 {
        lease = store.write("lease/n".into(), Precondition::Revision(lease.rv), Op::Put(renewal(i))).await.unwrap();
    }
    // The first renewal moves the counter on disk ahead; the others need no flush at all.
    assert_eq!(store.stats().flushes, flushes + 1);
    assert_eq!(store.stats().deferred, 4);
    // Any other write is flushed, and takes the renewals before it to disk.
    store.write("c/a".into(), Precondition::Absent, Op::Put(obj("a"))).await.unwrap();
    let flushed = lease.rv;
    lease = store.write("lease/n".into(), Precondition::Revision(lease.rv), Op::Put(renewal(6))).await.unwrap();
    assert_eq!(store.stats().deferred, 5);
    let handed_out = store.revision();

    let crashed = tempfile::tempdir().unwrap();
    copy_dir(&dir.path().join("db"), crashed.path());
    let reopened = Store::open(crashed.path(), options).unwrap();
    assert!(reopened.get("c/a").is_some());
    let kept = reopened.get("lease/n").unwrap();
    // The renewal after the last flush is lost, and only it.
    assert_eq!(kept.rv, flushed);
    // No revision anyone saw is handed out again.
    assert!(reopened.revision() >= handed_out);
    let next = reopened.write("c/b".into(), Precondition::Absent, Op::Put(obj("b"))).await.unwrap();
    assert!(next.rv > handed_out);
    // A clean stop loses nothing.
    store.sync().await.unwrap();
    let stopped = tempfile::tempdir().unwrap();
    copy_dir(&dir.path().join("db"), stopped.path());
    let reopened = Store::open(stopped.path(), Options::default()).unwrap();
    assert_eq!(reopened.get("lease/n").unwrap().rv, lease.rv);
}
