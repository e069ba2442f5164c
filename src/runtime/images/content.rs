//! containerd's content store as the import thread sees it: blobs written through the content
//! service (resumable writers, digests checked, gc labels), image records through the images service.

use super::*;

/// An image record's target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Target {
    pub(super) media_type: String,
    pub(super) digest: String,
    pub(super) size: i64,
    pub(super) annotations: BTreeMap<String, String>,
}

/// The synchronous view of containerd that the import thread uses (a fake one in unit tests).
pub(super) trait Store {
    /// The labels of a blob, or `None` when the store lacks it.
    fn info(&self, digest: &str) -> Result<Option<HashMap<String, String>>>;
    /// Starts writing a blob; `None` when `expected` is already there.
    fn begin(&self, expected: Option<(&str, u64)>) -> Result<Option<Box<dyn BlobWriter + '_>>>;
    fn read(&self, digest: &str, limit: u64) -> Result<Vec<u8>>;
    /// Sets (only) the given labels on a blob.
    fn set_labels(&self, digest: &str, labels: &BTreeMap<String, String>) -> Result<()>;
    fn put_image(&self, name: &str, target: &Target) -> Result<ImageChange>;
    fn cancelled(&self) -> bool;
    fn count_skipped(&self) {}
}

pub(super) trait BlobWriter {
    fn write(&mut self, data: &[u8]) -> Result<()>;
    /// Commits what was written as `digest`; `Ok(false)` when the store had it already.
    fn commit(self: Box<Self>, digest: &str, size: u64) -> Result<bool>;
    fn abort(self: Box<Self>);
}

pub(super) struct GrpcStore {
    pub(super) importer: Importer,
    pub(super) lease: String,
    pub(super) handle: Handle,
    pub(super) cancel: Arc<AtomicBool>,
    pub(super) seq: AtomicU64,
}

pub(super) type DrainResult = std::result::Result<Option<api::WriteContentResponse>, Status>;

/// One content `Write` stream: requests go through a channel, responses are drained by a task.
pub(super) struct GrpcWriter<'a> {
    store: &'a GrpcStore,
    reference: String,
    tx: Option<tokio::sync::mpsc::Sender<api::WriteContentRequest>>,
    drain: Option<tokio::task::JoinHandle<DrainResult>>,
    offset: i64,
    finished: bool,
}

impl GrpcStore {
    fn content(&self) -> ContentClient<Channel> {
        ContentClient::new(self.importer.channel.clone()).max_decoding_message_size(JSON_LIMIT as usize + (1 << 20))
    }
    fn req<T>(&self, msg: T) -> Request<T> {
        self.importer.unary(msg, Some(&self.lease))
    }
}

impl Store for GrpcStore {
    /// A blob found here is also added to the import's lease: it may be unreferenced (left by an
    /// earlier failed import), and garbage collection must not take it before the image points at it.
    fn info(&self, digest: &str) -> Result<Option<HashMap<String, String>>> {
        let req = self.req(api::InfoRequest { digest: digest.to_string() });
        let labels = match self.handle.block_on(self.content().info(req)) {
            Ok(resp) => resp.into_inner().info.map(|i| i.labels).unwrap_or_default(),
            Err(s) if s.code() == Code::NotFound => return Ok(None),
            Err(s) => return Err(status_error(&format!("looking up {digest}"), s)),
        };
        let hold = api::AddResourceRequest {
            id: self.lease.clone(),
            resource: Some(api::Resource { id: digest.to_string(), r#type: "content".into() }),
        };
        self.handle
            .block_on(LeasesClient::new(self.importer.channel.clone()).add_resource(self.importer.unary(hold, None)))
            .map_err(|s| status_error(&format!("holding {digest} in the import's lease"), s))?;
        Ok(Some(labels))
    }

    fn begin(&self, expected: Option<(&str, u64)>) -> Result<Option<Box<dyn BlobWriter + '_>>> {
        let reference = format!("{}-{}", self.lease, self.seq.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let first = api::WriteContentRequest {
            action: api::WriteAction::Write as i32,
            r#ref: reference.clone(),
            total: expected.map_or(0, |(_, size)| size as i64),
            expected: expected.map(|(d, _)| d.to_string()).unwrap_or_default(),
            ..Default::default()
        };
        tx.try_send(first).expect("fresh channel has room");
        let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        let req = self.importer.request(stream, Some(&self.lease));
        let mut client = self.content();
        let resp = match self.handle.block_on(client.write(req)) {
            Ok(resp) => resp,
            Err(s) if s.code() == Code::AlreadyExists => return Ok(None),
            Err(s) => return Err(status_error("starting a content write", s)),
        };
        let drain = self.handle.spawn(async move {
            let mut stream = resp.into_inner();
            let mut last = None;
            while let Some(msg) = stream.message().await? {
                last = Some(msg);
            }
            Ok(last)
        });
        Ok(Some(Box::new(GrpcWriter {
            store: self,
            reference,
            tx: Some(tx),
            drain: Some(drain),
            offset: 0,
            finished: false,
        })))
    }

    fn read(&self, digest: &str, limit: u64) -> Result<Vec<u8>> {
        let req = self.req(api::ReadContentRequest { digest: digest.to_string(), offset: 0, size: 0 });
        let mut client = self.content();
        self.handle.block_on(async {
            let mut stream =
                client.read(req).await.map_err(|s| status_error(&format!("reading {digest}"), s))?.into_inner();
            let mut out = Vec::new();
            while let Some(msg) = stream.message().await.map_err(|s| status_error(&format!("reading {digest}"), s))? {
                out.extend_from_slice(&msg.data);
                if out.len() as u64 > limit {
                    bail!("{digest} is larger than {limit} bytes");
                }
            }
            Ok(out)
        })
    }

    fn set_labels(&self, digest: &str, labels: &BTreeMap<String, String>) -> Result<()> {
        let req = self.req(api::UpdateRequest {
            info: Some(api::Info {
                digest: digest.to_string(),
                labels: labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask { paths: labels.keys().map(|k| format!("labels.{k}")).collect() }),
        });
        self.handle
            .block_on(self.content().update(req))
            .map_err(|s| status_error(&format!("labelling {digest}"), s))?;
        bump(&self.importer.counters.labels_updated, 1);
        Ok(())
    }

    fn put_image(&self, name: &str, target: &Target) -> Result<ImageChange> {
        let desc = Descriptor {
            media_type: target.media_type.clone(),
            digest: target.digest.clone(),
            size: target.size,
            annotations: target.annotations.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        };
        let mut client = ImagesClient::new(self.importer.channel.clone());
        let counters = &self.importer.counters;
        for _ in 0..3 {
            match self.handle.block_on(client.get(self.req(api::GetImageRequest { name: name.to_string() }))) {
                Ok(resp) => {
                    let Some(existing) = resp.into_inner().image else {
                        bail!("containerd returned no image for {name}")
                    };
                    if existing.target.as_ref() == Some(&desc) {
                        return Ok(ImageChange::Unchanged);
                    }
                    let image = api::Image { target: Some(desc.clone()), ..existing };
                    let req = api::UpdateImageRequest {
                        image: Some(image),
                        update_mask: Some(prost_types::FieldMask { paths: vec!["target".into()] }),
                        source_date_epoch: None,
                    };
                    self.handle
                        .block_on(client.update(self.req(req)))
                        .map_err(|s| status_error(&format!("updating image {name}"), s))?;
                    bump(&counters.images_updated, 1);
                    return Ok(ImageChange::Updated);
                }
                Err(s) if s.code() == Code::NotFound => {
                    let image = api::Image { name: name.to_string(), target: Some(desc.clone()), ..Default::default() };
                    let req = api::CreateImageRequest { image: Some(image), source_date_epoch: None };
                    match self.handle.block_on(client.create(self.req(req))) {
                        Ok(_) => {
                            bump(&counters.images_created, 1);
                            return Ok(ImageChange::Created);
                        }
                        // Created meanwhile by someone else: look again.
                        Err(s) if s.code() == Code::AlreadyExists => continue,
                        Err(s) => return Err(status_error(&format!("creating image {name}"), s)),
                    }
                }
                Err(s) => return Err(status_error(&format!("looking up image {name}"), s)),
            }
        }
        bail!("image {name} keeps changing under the import")
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    fn count_skipped(&self) {
        bump(&self.importer.counters.blobs_skipped, 1);
    }
}

impl GrpcWriter<'_> {
    fn send(&mut self, msg: api::WriteContentRequest) -> Result<()> {
        let tx = self.tx.as_ref().ok_or_else(|| anyhow!("content write already closed"))?;
        let drain = self.drain.as_mut().ok_or_else(|| anyhow!("content write already closed"))?;
        // Send, unless containerd ended the stream meanwhile (then say why).
        let early = self.store.handle.block_on(async {
            tokio::select! {
                biased;
                sent = tx.send(msg) => sent.err().map(|_| None),
                ended = drain => Some(Some(ended)),
            }
        });
        match early {
            None => Ok(()),
            Some(ended) => {
                self.tx = None;
                let ended = match ended {
                    Some(e) => {
                        self.drain = None;
                        e
                    }
                    None => self.store.handle.block_on(self.drain.take().expect("drain present")),
                };
                match ended {
                    Ok(Err(s)) => Err(status_error("writing content", s)),
                    Ok(Ok(_)) => {
                        Err(anyhow::Error::new(Unavailable("writing content: containerd ended the write early".into())))
                    }
                    Err(e) => Err(anyhow!("writing content: {e}")),
                }
            }
        }
    }

    fn close(&mut self) -> Option<std::result::Result<DrainResult, tokio::task::JoinError>> {
        self.tx = None;
        let drain = self.drain.take()?;
        Some(self.store.handle.block_on(async {
            match tokio::time::timeout(Duration::from_secs(30), drain).await {
                Ok(r) => r,
                Err(_) => Ok(Err(Status::deadline_exceeded("no answer to the commit"))),
            }
        }))
    }

    fn abort_inner(&mut self) {
        self.finished = true;
        let _ = self.close();
        let req = self.store.req(api::AbortRequest { r#ref: self.reference.clone() });
        if let Err(s) = self.store.handle.block_on(self.store.content().abort(req))
            && s.code() != Code::NotFound
        {
            tracing::debug!("aborting content write {}: {}", self.reference, s.message());
        }
    }
}

impl BlobWriter for GrpcWriter<'_> {
    fn write(&mut self, data: &[u8]) -> Result<()> {
        let msg = api::WriteContentRequest {
            action: api::WriteAction::Write as i32,
            offset: self.offset,
            data: data.to_vec(),
            ..Default::default()
        };
        self.send(msg)?;
        self.offset += data.len() as i64;
        bump(&self.store.importer.counters.bytes_written, data.len() as u64);
        Ok(())
    }

    fn commit(mut self: Box<Self>, digest: &str, size: u64) -> Result<bool> {
        self.finished = true;
        let msg = api::WriteContentRequest {
            action: api::WriteAction::Commit as i32,
            offset: self.offset,
            total: size as i64,
            expected: digest.to_string(),
            ..Default::default()
        };
        let sent = self.send(msg);
        let ended = self.close();
        sent?;
        match ended {
            Some(Ok(Ok(_))) => {
                bump(&self.store.importer.counters.blobs_written, 1);
                Ok(true)
            }
            Some(Ok(Err(s))) if s.code() == Code::AlreadyExists => Ok(false),
            Some(Ok(Err(s))) => Err(status_error(&format!("committing {digest}"), s)),
            Some(Err(e)) => Err(anyhow!("committing {digest}: {e}")),
            None => Err(anyhow!("committing {digest}: the write was already closed")),
        }
    }

    fn abort(mut self: Box<Self>) {
        self.abort_inner();
    }
}

impl Drop for GrpcWriter<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.abort_inner();
        }
    }
}
