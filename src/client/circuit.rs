//! The circuit breaker of the subscriber (closed → open → half-open), as
//! the Anypoint MQ Subscriber source has it: `errors_threshold` consecutive
//! handler failures of the counted kinds trip it; it stays open for
//! `trip_timeout` (no fetching, buffered messages nacked); then one message
//! tests the service: success closes it, a counted failure opens it again.
//! Breakers can be shared by name across subscribers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

/// Circuit breaker settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CircuitConfig {
    /// Handler error kinds that count as failures; empty counts every kind.
    pub error_types: Vec<String>,
    /// Consecutive counted failures that trip the circuit.
    pub errors_threshold: u32,
    /// How long the circuit stays open.
    pub trip_timeout: Duration,
}

/// The state of a circuit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    /// Messages flow.
    Closed,
    /// Tripped: no fetching until the trip timeout ends.
    Open,
    /// One message is testing the service.
    HalfOpen,
}

/// What a subscriber may fetch now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Permit {
    /// Fetch normally.
    Flow,
    /// Fetch exactly one message to test the service (this caller has the
    /// probe and must report its outcome or release it).
    Probe,
    /// Fetch nothing before this instant (open, or another subscriber
    /// holds the probe).
    Wait(Instant),
}

#[derive(Debug)]
struct Inner {
    state: CircuitState,
    failures: u32,
    open_until: Instant,
    probe_out: bool,
    history: Vec<CircuitState>,
}

/// A circuit breaker; see the module documentation.
#[derive(Debug)]
pub struct CircuitBreaker {
    name: String,
    config: CircuitConfig,
    inner: Mutex<Inner>,
}

static SHARED: OnceLock<Mutex<HashMap<String, Arc<CircuitBreaker>>>> = OnceLock::new();

impl CircuitBreaker {
    /// A private breaker.
    pub fn new(name: impl Into<String>, config: CircuitConfig) -> Arc<CircuitBreaker> {
        Arc::new(CircuitBreaker {
            name: name.into(),
            config,
            inner: Mutex::new(Inner {
                state: CircuitState::Closed,
                failures: 0,
                open_until: Instant::now(),
                probe_out: false,
                history: vec![CircuitState::Closed],
            }),
        })
    }

    /// The breaker registered under `name` in this process, created with
    /// `config` if there is none yet: subscribers that use the same name
    /// share one circuit.
    pub fn shared(name: &str, config: CircuitConfig) -> Arc<CircuitBreaker> {
        let registry = SHARED.get_or_init(Mutex::default);
        let mut map = registry.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(
            map.entry(name.to_string())
                .or_insert_with(|| CircuitBreaker::new(name, config)),
        )
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(inner: &mut Inner, s: CircuitState) {
        if inner.state != s {
            inner.state = s;
            inner.history.push(s);
        }
    }

    /// The current state.
    pub fn state(&self) -> CircuitState {
        self.lock().state
    }

    /// Every state the circuit went through, oldest first.
    pub fn history(&self) -> Vec<CircuitState> {
        self.lock().history.clone()
    }

    pub(super) fn permit(&self) -> Permit {
        let mut i = self.lock();
        match i.state {
            CircuitState::Closed => Permit::Flow,
            CircuitState::Open if Instant::now() < i.open_until => Permit::Wait(i.open_until),
            CircuitState::Open | CircuitState::HalfOpen => {
                if i.probe_out {
                    return Permit::Wait(Instant::now() + Duration::from_millis(50));
                }
                Self::set(&mut i, CircuitState::HalfOpen);
                i.probe_out = true;
                Permit::Probe
            }
        }
    }

    /// A handler finished without error.
    pub(super) fn on_success(&self) {
        let mut i = self.lock();
        i.failures = 0;
        i.probe_out = false;
        Self::set(&mut i, CircuitState::Closed);
    }

    /// A handler failed with an error of `kind`.
    pub(super) fn on_failure(&self, kind: &str) {
        let counted =
            self.config.error_types.is_empty() || self.config.error_types.iter().any(|t| t == kind);
        let mut i = self.lock();
        let probing = i.state == CircuitState::HalfOpen;
        i.probe_out = false;
        if !counted {
            // Not the service's fault: a probe that fails this way still
            // shows the service answering.
            if probing {
                i.failures = 0;
                Self::set(&mut i, CircuitState::Closed);
            }
            return;
        }
        i.failures += 1;
        if probing || i.failures >= self.config.errors_threshold.max(1) {
            i.failures = 0;
            i.open_until = Instant::now() + self.config.trip_timeout;
            Self::set(&mut i, CircuitState::Open);
            tracing::warn!(circuit = %self.name, "circuit breaker open");
        }
    }

    /// Gives the probe back unused (the subscriber got no message or
    /// stopped).
    pub(super) fn release_probe(&self) {
        self.lock().probe_out = false;
    }
}
