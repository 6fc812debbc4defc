//! The admin calls of [`Client`]: queues, FIFO groups, exchanges and
//! bindings, browse, redrive and definitions.

use std::time::Duration;

use super::{Client, Result, missing, pb};

impl Client {
    /// Creates a queue (a no-op if an identical one exists).
    pub async fn create_queue(&self, name: &str, config: pb::QueueConfig) -> Result<pb::Queue> {
        let r = self
            .call(true, Duration::ZERO, || {
                let mut c = self.admin();
                let req = pb::CreateQueueRequest {
                    name: name.into(),
                    config: Some(config.clone()),
                };
                async move { c.create_queue(req).await }
            })
            .await?;
        r.queue.ok_or_else(|| missing("queue"))
    }

    /// Describes a queue.
    pub async fn get_queue(&self, name: &str) -> Result<pb::Queue> {
        let r = self
            .call(true, Duration::ZERO, || {
                let mut c = self.admin();
                let req = pb::GetQueueRequest { name: name.into() };
                async move { c.get_queue(req).await }
            })
            .await?;
        r.queue.ok_or_else(|| missing("queue"))
    }

    /// Lists every queue whose name starts with `prefix` (all pages).
    pub async fn list_queues(&self, prefix: &str) -> Result<Vec<pb::Queue>> {
        let mut out = Vec::new();
        let mut token = String::new();
        loop {
            let page = self
                .call(true, Duration::ZERO, || {
                    let mut c = self.admin();
                    let req = pb::ListQueuesRequest {
                        page_size: 1000,
                        page_token: token.clone(),
                        prefix: prefix.into(),
                    };
                    async move { c.list_queues(req).await }
                })
                .await?;
            out.extend(page.queues);
            if page.next_page_token.is_empty() {
                return Ok(out);
            }
            token = page.next_page_token;
        }
    }

    /// Changes a queue's configuration.
    pub async fn update_queue(&self, req: pb::UpdateQueueRequest) -> Result<pb::Queue> {
        let r = self
            .call(true, Duration::ZERO, || {
                let mut c = self.admin();
                let req = req.clone();
                async move { c.update_queue(req).await }
            })
            .await?;
        r.queue.ok_or_else(|| missing("queue"))
    }

    /// Deletes a queue; returns how many messages went with it.
    pub async fn delete_queue(&self, name: &str, force: bool) -> Result<u64> {
        let r = self
            .call(true, Duration::ZERO, || {
                let mut c = self.admin();
                let req = pb::DeleteQueueRequest {
                    name: name.into(),
                    force,
                };
                async move { c.delete_queue(req).await }
            })
            .await?;
        Ok(r.messages_deleted)
    }

    /// Deletes every message of a queue; returns how many.
    pub async fn purge_queue(&self, name: &str) -> Result<u64> {
        let r = self
            .call(true, Duration::ZERO, || {
                let mut c = self.admin();
                let req = pb::PurgeQueueRequest { name: name.into() };
                async move { c.purge_queue(req).await }
            })
            .await?;
        Ok(r.messages_deleted)
    }

    /// Exact figures of a queue.
    pub async fn stats(&self, name: &str) -> Result<pb::QueueStats> {
        let r = self
            .call(true, Duration::ZERO, || {
                let mut c = self.admin();
                let req = pb::GetQueueStatsRequest { name: name.into() };
                async move { c.get_queue_stats(req).await }
            })
            .await?;
        r.stats.ok_or_else(|| missing("stats"))
    }

    /// Reads a page of messages without leasing them.
    pub async fn browse(
        &self,
        queue: &str,
        max: u32,
        page_token: &str,
    ) -> Result<pb::BrowseResponse> {
        self.call(true, Duration::ZERO, || {
            let mut c = self.admin();
            let req = pb::BrowseRequest {
                queue: queue.into(),
                max_messages: max,
                page_token: page_token.into(),
            };
            async move { c.browse(req).await }
        })
        .await
    }

    /// Lists a FIFO queue's groups (one page).
    pub async fn list_groups(&self, req: pb::ListGroupsRequest) -> Result<pb::ListGroupsResponse> {
        self.call(true, Duration::ZERO, || {
            let mut c = self.admin();
            let req = req.clone();
            async move { c.list_groups(req).await }
        })
        .await
    }

    /// Moves a FIFO group's head to the dead letter queue.
    pub async fn skip_head(&self, queue: &str, group: &str, note: &str) -> Result<String> {
        let r = self
            .call(false, Duration::ZERO, || {
                let mut c = self.admin();
                let req = pb::SkipHeadRequest {
                    queue: queue.into(),
                    group_id: group.into(),
                    note: note.into(),
                };
                async move { c.skip_head(req).await }
            })
            .await?;
        Ok(r.message_id)
    }

    /// Releases a parked FIFO group.
    pub async fn release_group(&self, queue: &str, group: &str) -> Result<String> {
        let r = self
            .call(false, Duration::ZERO, || {
                let mut c = self.admin();
                let req = pb::ReleaseGroupRequest {
                    queue: queue.into(),
                    group_id: group.into(),
                };
                async move { c.release_group(req).await }
            })
            .await?;
        Ok(r.head_message_id)
    }

    /// Creates a fanout exchange (a no-op if it exists).
    pub async fn create_exchange(&self, name: &str) -> Result<pb::Exchange> {
        let r = self
            .call(true, Duration::ZERO, || {
                let mut c = self.admin();
                let req = pb::CreateExchangeRequest { name: name.into() };
                async move { c.create_exchange(req).await }
            })
            .await?;
        r.exchange.ok_or_else(|| missing("exchange"))
    }

    /// Describes an exchange.
    pub async fn get_exchange(&self, name: &str) -> Result<pb::Exchange> {
        let r = self
            .call(true, Duration::ZERO, || {
                let mut c = self.admin();
                let req = pb::GetExchangeRequest { name: name.into() };
                async move { c.get_exchange(req).await }
            })
            .await?;
        r.exchange.ok_or_else(|| missing("exchange"))
    }

    /// Lists every exchange.
    pub async fn list_exchanges(&self) -> Result<Vec<pb::Exchange>> {
        let mut out = Vec::new();
        let mut token = String::new();
        loop {
            let page = self
                .call(true, Duration::ZERO, || {
                    let mut c = self.admin();
                    let req = pb::ListExchangesRequest {
                        page_size: 1000,
                        page_token: token.clone(),
                    };
                    async move { c.list_exchanges(req).await }
                })
                .await?;
            out.extend(page.exchanges);
            if page.next_page_token.is_empty() {
                return Ok(out);
            }
            token = page.next_page_token;
        }
    }

    /// Deletes an exchange and its bindings.
    pub async fn delete_exchange(&self, name: &str) -> Result<()> {
        self.call(true, Duration::ZERO, || {
            let mut c = self.admin();
            let req = pb::DeleteExchangeRequest { name: name.into() };
            async move { c.delete_exchange(req).await }
        })
        .await?;
        Ok(())
    }

    /// Binds a queue to an exchange with a property filter.
    pub async fn bind(
        &self,
        exchange: &str,
        queue: &str,
        filter: Vec<(String, String)>,
    ) -> Result<pb::Exchange> {
        let r = self
            .call(true, Duration::ZERO, || {
                let mut c = self.admin();
                let req = pb::BindRequest {
                    exchange: exchange.into(),
                    binding: Some(pb::Binding {
                        queue: queue.into(),
                        filter: filter.iter().cloned().collect(),
                    }),
                };
                async move { c.bind(req).await }
            })
            .await?;
        r.exchange.ok_or_else(|| missing("exchange"))
    }

    /// Removes a queue's binding to an exchange.
    pub async fn unbind(&self, exchange: &str, queue: &str) -> Result<pb::Exchange> {
        let r = self
            .call(true, Duration::ZERO, || {
                let mut c = self.admin();
                let req = pb::UnbindRequest {
                    exchange: exchange.into(),
                    queue: queue.into(),
                };
                async move { c.unbind(req).await }
            })
            .await?;
        r.exchange.ok_or_else(|| missing("exchange"))
    }

    /// Starts a redrive; the stream yields progress, the last item with
    /// `done` set.
    pub async fn redrive(
        &self,
        req: pb::RedriveRequest,
    ) -> Result<tonic::Streaming<pb::RedriveResponse>> {
        let mut c = self.admin();
        Ok(c.redrive(req).await?.into_inner())
    }

    /// The server's definitions document (JSON).
    pub async fn export_definitions(&self) -> Result<String> {
        let r = self
            .call(true, Duration::ZERO, || {
                let mut c = self.admin();
                async move { c.export_definitions(pb::ExportDefinitionsRequest {}).await }
            })
            .await?;
        Ok(r.json)
    }

    /// Applies a definitions document (JSON), atomically.
    pub async fn import_definitions(&self, json: &str) -> Result<pb::ImportDefinitionsResponse> {
        self.call(true, Duration::ZERO, || {
            let mut c = self.admin();
            let req = pb::ImportDefinitionsRequest { json: json.into() };
            async move { c.import_definitions(req).await }
        })
        .await
    }
}
