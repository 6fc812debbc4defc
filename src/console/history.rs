//! The plots' memory: every few seconds (`--console-sample-interval`, 5 s by
//! default) one pass over every queue's exact figures
//! ([`Broker::all_stats`], one hold of the engine's lock), kept in memory
//! for an hour: at the sampling step for the last 15 minutes, then one
//! sample a minute. A sample is stored only when it differs from the one
//! before it, so an idle queue costs one sample whatever the time, and a
//! busy one at most 240 (about 17 KiB). Nothing of it is on disk: a
//! restart starts the plots afresh.
//!
//! The same pass keeps the store's figures, for the server facts (commits
//! per second, log sync latency).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::queue::model::QueueStats;
use crate::storage::StoreStats;

use super::Console;

/// The fine window.
pub(crate) const FINE_WINDOW: u64 = 15 * 60_000;
/// The whole window.
pub(crate) const WINDOW: u64 = 60 * 60_000;
/// The coarse step.
const COARSE_STEP: u64 = 60_000;

/// One queue's figures at one time: depths, and counters since the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sample {
    pub(crate) ready: u64,
    pub(crate) in_flight: u64,
    pub(crate) delayed: u64,
    pub(crate) parked: u64,
    pub(crate) published: u64,
    pub(crate) acked: u64,
    pub(crate) nacked: u64,
    pub(crate) dead_lettered: u64,
}

impl Sample {
    pub(crate) fn of(s: &QueueStats) -> Sample {
        Sample {
            ready: s.ready,
            in_flight: s.in_flight,
            delayed: s.delayed,
            parked: s.parked,
            published: s.counters.published,
            acked: s.counters.acked,
            nacked: s.counters.nacked,
            dead_lettered: s.counters.dead_lettered,
        }
    }
}

/// A queue's samples, oldest first, each kept only when it changed.
#[derive(Debug, Default)]
struct Series {
    points: VecDeque<(u64, Sample)>,
}

impl Series {
    fn push(&mut self, at: u64, s: Sample, step: u64) {
        if self.points.back().is_some_and(|(_, last)| *last == s) {
            return;
        }
        self.points.push_back((at, s));
        // Older than the fine window: keep one point per coarse step.
        let fine_from = at.saturating_sub(FINE_WINDOW);
        let mut kept: VecDeque<(u64, Sample)> = VecDeque::with_capacity(self.points.len());
        for &(t, p) in &self.points {
            if t < fine_from
                && let Some(&(lt, _)) = kept.back()
                && t / COARSE_STEP == lt / COARSE_STEP
            {
                // Same coarse slot: the later one stands for it.
                kept.pop_back();
            }
            kept.push_back((t, p));
        }
        self.points = kept;
        // Older than the window: only the last such point is needed, as
        // the value at the window's start.
        let from = at.saturating_sub(WINDOW + step);
        while self.points.len() > 1 && self.points[1].0 <= from {
            self.points.pop_front();
        }
    }

    /// The sample in force at `t`.
    fn at(&self, t: u64) -> Option<Sample> {
        self.points
            .iter()
            .rev()
            .find(|(pt, _)| *pt <= t)
            .map(|(_, s)| *s)
    }
}

/// The store's figures at the last two samples.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct StoreRate {
    /// Group commits (log syncs) per second.
    pub(crate) commits_per_second: f64,
    /// Mean log write + sync time, in microseconds; `None` when no sync
    /// happened over the step (an idle server), which is not 0 µs.
    pub(crate) sync_micros: Option<f64>,
}

#[derive(Debug, Default)]
struct Inner {
    queues: HashMap<String, Series>,
    store: Option<(u64, StoreStats)>,
    rate: StoreRate,
    last: u64,
}

/// The samples of every queue.
#[derive(Debug)]
pub(crate) struct History {
    step: Duration,
    inner: Mutex<Inner>,
}

/// A plot's data: times (unix seconds) and one column per series.
#[derive(Debug, serde::Serialize)]
pub(crate) struct Plot {
    pub(crate) t: Vec<f64>,
    pub(crate) ready: Vec<u64>,
    pub(crate) in_flight: Vec<u64>,
    pub(crate) delayed: Vec<u64>,
    pub(crate) published: Vec<f64>,
    pub(crate) acked: Vec<f64>,
    pub(crate) nacked: Vec<f64>,
    pub(crate) dead_lettered: Vec<f64>,
}

fn per_second(now: u64, then: u64, dt_ms: u64) -> f64 {
    if dt_ms == 0 {
        return 0.0;
    }
    now.saturating_sub(then) as f64 * 1000.0 / dt_ms as f64
}

impl History {
    pub(crate) fn new(step: Duration) -> History {
        History {
            step,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn step_ms(&self) -> u64 {
        u64::try_from(self.step.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Takes one sample of every queue and of the store.
    pub(crate) fn record(
        &self,
        at: u64,
        queues: &[(String, Option<String>, QueueStats)],
        store: StoreStats,
    ) {
        let step = self.step_ms();
        let mut g = self.lock();
        let mut seen: HashMap<String, Series> = HashMap::with_capacity(queues.len());
        let mut old = std::mem::take(&mut g.queues);
        for (name, _, stats) in queues {
            let mut series = old.remove(name).unwrap_or_default();
            series.push(at, Sample::of(stats), step);
            seen.insert(name.clone(), series);
        }
        g.queues = seen;
        if let Some((then, before)) = g.store {
            let dt = at.saturating_sub(then);
            let syncs = store.log_syncs.saturating_sub(before.log_syncs);
            g.rate = StoreRate {
                commits_per_second: per_second(store.log_syncs, before.log_syncs, dt),
                sync_micros: (syncs > 0).then(|| {
                    store.sync_micros.saturating_sub(before.sync_micros) as f64 / syncs as f64
                }),
            };
        }
        g.store = Some((at, store));
        g.last = at;
    }

    /// Commits per second and sync latency over the last sampling step.
    pub(crate) fn store_rate(&self) -> StoreRate {
        self.lock().rate
    }

    /// A queue's publish, ack, nack and dead-letter rates (per second)
    /// over the last minute, up to `now`'s figures.
    pub(crate) fn rates(&self, name: &str, now_at: u64, now: &Sample) -> [f64; 4] {
        let g = self.lock();
        let Some(series) = g.queues.get(name) else {
            return [0.0; 4];
        };
        let Some(&(first, _)) = series.points.front() else {
            return [0.0; 4];
        };
        let from = now_at.saturating_sub(60_000).max(first);
        let Some(then) = series.at(from) else {
            return [0.0; 4];
        };
        let dt = now_at.saturating_sub(from);
        [
            per_second(now.published, then.published, dt),
            per_second(now.acked, then.acked, dt),
            per_second(now.nacked, then.nacked, dt),
            per_second(now.dead_lettered, then.dead_lettered, dt),
        ]
    }

    /// A queue's plot over the last `window` ms, at the sampling step
    /// (one point a minute beyond the fine window), ending with `now`'s
    /// figures. Rates are per second between consecutive points.
    pub(crate) fn plot(&self, name: &str, window: u64, now_at: u64, now: Sample) -> Plot {
        let step = if window > FINE_WINDOW {
            COARSE_STEP
        } else {
            self.step_ms()
        };
        let g = self.lock();
        let series = g.queues.get(name);
        let first = series
            .and_then(|s| s.points.front())
            .map_or(now_at, |(t, _)| *t);
        let start = now_at.saturating_sub(window).max(first);
        let mut times: Vec<u64> = (0..)
            .map(|i| start + i * step)
            .take_while(|t| *t < now_at)
            .collect();
        times.push(now_at);
        let mut plot = Plot {
            t: Vec::with_capacity(times.len()),
            ready: Vec::with_capacity(times.len()),
            in_flight: Vec::with_capacity(times.len()),
            delayed: Vec::with_capacity(times.len()),
            published: Vec::with_capacity(times.len()),
            acked: Vec::with_capacity(times.len()),
            nacked: Vec::with_capacity(times.len()),
            dead_lettered: Vec::with_capacity(times.len()),
        };
        let mut prev: Option<(u64, Sample)> = None;
        for t in times {
            let s = if t == now_at {
                now
            } else {
                series.and_then(|s| s.at(t)).unwrap_or(now)
            };
            let (dt, before) = prev.map_or((0, s), |(pt, ps)| (t - pt, ps));
            plot.t.push(t as f64 / 1000.0);
            plot.ready.push(s.ready);
            plot.in_flight.push(s.in_flight);
            plot.delayed.push(s.delayed);
            plot.published
                .push(per_second(s.published, before.published, dt));
            plot.acked.push(per_second(s.acked, before.acked, dt));
            plot.nacked.push(per_second(s.nacked, before.nacked, dt));
            plot.dead_lettered
                .push(per_second(s.dead_lettered, before.dead_lettered, dt));
            prev = Some((t, s));
        }
        plot
    }
}

/// Samples until `stop` resolves.
pub(crate) async fn sample(console: Arc<Console>, stop: tokio::sync::oneshot::Receiver<()>) {
    let mut tick = tokio::time::interval(console.history.step);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tick.tick() => {}
        }
        let c = Arc::clone(&console);
        // One pass over every queue under the engine's lock: off the
        // async workers.
        let taken = tokio::task::spawn_blocking(move || {
            let at = c.now();
            let stats = c.broker.all_stats();
            let store = c.broker.store().stats().unwrap_or_default();
            c.history.record(at, &stats, store);
        })
        .await;
        if let Err(e) = taken {
            tracing::warn!(error = %e, "console: taking a sample failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::model::QueueCounters;

    fn s(ready: u64, published: u64) -> Sample {
        Sample {
            ready,
            published,
            ..Sample::default()
        }
    }

    #[test]
    fn an_idle_queue_keeps_one_sample_and_a_busy_one_a_bounded_number() {
        let mut idle = Series::default();
        let mut busy = Series::default();
        for i in 0..2000u64 {
            idle.push(i * 5000, s(3, 10), 5000);
            busy.push(i * 5000, s(i, i * 10), 5000);
        }
        assert_eq!(idle.points.len(), 1);
        // 15 minutes at 5 s (both ends), then 45 or 46 one-minute slots,
        // plus the baseline.
        assert!(busy.points.len() <= 181 + 46 + 1, "{}", busy.points.len());
        assert!(busy.points.len() >= 180 + 44, "{}", busy.points.len());
        let last = 1999 * 5000;
        assert_eq!(busy.at(last).map(|x| x.ready), Some(1999));
        // An hour back is still answered (from the baseline or a slot).
        assert!(busy.at(last - WINDOW).is_some());
    }

    #[test]
    fn rates_come_from_the_counters_over_the_last_minute() {
        let h = History::new(Duration::from_secs(5));
        let stats = |published| QueueStats {
            counters: QueueCounters {
                published,
                ..QueueCounters::default()
            },
            ..QueueStats::default()
        };
        h.record(0, &[("q".into(), None, stats(0))], StoreStats::default());
        h.record(
            60_000,
            &[("q".into(), None, stats(600))],
            StoreStats::default(),
        );
        let r = h.rates("q", 60_000, &s(0, 600));
        assert!((r[0] - 10.0).abs() < 1e-9, "{r:?}");
        let p = h.plot("q", FINE_WINDOW, 65_000, s(5, 650));
        assert_eq!(p.t.len(), p.ready.len());
        assert_eq!(*p.ready.last().unwrap_or(&0), 5);
        assert!(p.published.iter().any(|r| *r > 0.0), "{:?}", p.published);
    }

    #[test]
    fn an_idle_store_has_no_sync_latency_rather_than_zero() {
        let h = History::new(Duration::from_secs(5));
        let store = |log_syncs, sync_micros| StoreStats {
            log_syncs,
            sync_micros,
            ..StoreStats::default()
        };
        assert_eq!(h.store_rate().sync_micros, None);
        h.record(0, &[], store(10, 5000));
        h.record(5000, &[], store(10, 5000));
        assert_eq!(h.store_rate().sync_micros, None);
        assert_eq!(h.store_rate().commits_per_second, 0.0);
        h.record(10_000, &[], store(14, 5800));
        assert_eq!(h.store_rate().sync_micros, Some(200.0));
    }
}
