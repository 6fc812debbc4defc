//! What a run prints at its end: the summary of what happened, and a
//! soak's figures and verdict.

use std::time::Duration;

use super::{Args, Nemesis, checker, history, soak, workload};

/// Judges a soak: disk use must come back down after the drain, memory
/// must not keep growing; prints the figures.
pub(super) fn soak_verdict(
    samples: &[soak::Sample],
    after: soak::Sample,
    health: &mut Vec<String>,
) {
    use soak::mib;
    let first = samples[0];
    let peak_disk = samples.iter().map(|s| s.disk).max().unwrap_or(0);
    let peak_backlog = samples.iter().map(|s| s.backlog).max().unwrap_or(0);
    let third = samples.len().div_ceil(3);
    let rss_early = samples[..third].iter().map(|s| s.rss).max().unwrap_or(0);
    let rss_late = samples[samples.len() - third..]
        .iter()
        .map(|s| s.rss)
        .max()
        .unwrap_or(0);
    let rss_peak = samples.iter().map(|s| s.rss).max().unwrap_or(0);
    let minutes = samples.last().map_or(1.0, |s| s.at / 60.0).max(1.0 / 60.0);
    println!();
    println!(
        "soak: {:.1} min, {} samples; peak backlog {peak_backlog} messages",
        minutes,
        samples.len()
    );
    println!(
        "soak: disk {:.1} MiB at the start, {:.1} MiB at the peak, {:.1} MiB after the drain and two checkpoints",
        mib(first.disk),
        mib(peak_disk),
        mib(after.disk)
    );
    println!(
        "soak: RSS {:.1} MiB at the start, highest {:.1} MiB in the first third, {:.1} MiB in the last third, peak {:.1} MiB, {:.1} MiB after the drain",
        mib(first.rss),
        mib(rss_early),
        mib(rss_late),
        mib(rss_peak),
        mib(after.rss)
    );
    println!(
        "soak: server log {:.2} MiB ({:.1} KiB per minute)",
        mib(after.log),
        after.log as f64 / 1024.0 / minutes
    );
    // Space comes back: what the backlog took outside the log's fixed-size
    // files (the database) is mostly returned, and the log is back to its
    // bounded reserve: the current segment, the next one prepared, and at
    // most two spares kept for reuse.
    let data = |s: &soak::Sample| s.disk.saturating_sub(s.wal);
    let peak_data = samples.iter().map(data).max().unwrap_or(0);
    let peak_wal_files = samples.iter().map(|s| s.wal_files).max().unwrap_or(0);
    println!(
        "soak: outside the log {:.1} MiB at the start, {:.1} MiB at the peak, {:.1} MiB after; log {} file(s) ({:.1} MiB) at the start, {} at the peak, {} ({:.1} MiB) after",
        mib(data(&first)),
        mib(peak_data),
        mib(data(&after)),
        first.wal_files,
        mib(first.wal),
        peak_wal_files,
        after.wal_files,
        mib(after.wal)
    );
    let grown = peak_data.saturating_sub(data(&first));
    let kept = data(&after).saturating_sub(data(&first));
    if grown > 16 << 20 && kept * 2 > grown {
        health.push(format!(
            "soak: disk use did not come back down: {:.1} MiB outside the log at the start, {:.1} MiB at the peak, {:.1} MiB after the drain",
            mib(data(&first)),
            mib(peak_data),
            mib(data(&after))
        ));
    }
    if after.wal_files > 4 {
        health.push(format!(
            "soak: the log kept {} files after the drain (at most 4: current, next, two spares)",
            after.wal_files
        ));
    }
    // Memory is bounded: no growth from the first third to the last
    // beyond a quarter (caches fill early).
    if rss_late > rss_early + rss_early / 4 + (32 << 20) {
        health.push(format!(
            "soak: memory kept growing: RSS {:.1} MiB in the first third, {:.1} MiB in the last",
            mib(rss_early),
            mib(rss_late)
        ));
    }
}

/// Prints what the run did: operations, kill points, takeovers, damage,
/// power cuts, file-system calls, the server's counters, and the
/// checker's table.
pub(super) fn print_summary(
    args: &Args,
    seed: u64,
    nem: &Nemesis,
    recs: &history::Records,
    report: &checker::Report,
    took: Duration,
) {
    // A call through the exchange that filled two queues has a record for
    // each: count it once.
    let mut seen_calls = std::collections::HashSet::new();
    let calls: Vec<&history::Publish> = recs
        .publishes
        .iter()
        .filter(|p| {
            p.exchange
                .as_ref()
                .is_none_or(|(_, c)| seen_calls.insert(*c))
        })
        .collect();
    let through_exchange = calls.iter().filter(|p| p.exchange.is_some()).count();
    let count =
        |f: &dyn Fn(&history::Outcome) -> bool| calls.iter().filter(|p| f(&p.outcome)).count();
    let msgs: usize = recs.publishes.iter().map(|p| p.msgs.len()).sum();
    println!();
    println!(
        "chaos: seed {seed}, {} mode, {} kill cycles, {} server starts, {:.0} s",
        if args.power_loss {
            "power-loss"
        } else {
            "kill -9"
        },
        args.cycles,
        nem.epoch,
        took.as_secs_f64()
    );
    println!(
        "operations: {} publish calls ({} through {}; {} messages; ok {}, fail {}, info {}), {} receive calls (ok {}, fail {}, info {}), {} deliveries, {} settles, {} admin calls",
        calls.len(),
        through_exchange,
        workload::EXCHANGE,
        msgs,
        count(&|o| o.is_ok()),
        count(&|o| o.is_fail()),
        count(&|o| o.is_info()),
        recs.receives.0 + recs.receives.1 + recs.receives.2,
        recs.receives.0,
        recs.receives.1,
        recs.receives.2,
        recs.deliveries.len(),
        recs.settles.len(),
        recs.admin.len()
    );
    let hits: Vec<String> = nem.hits.iter().map(|(c, n)| format!("{c} {n}")).collect();
    println!("kill points hit: {}", hits.join(", "));
    if let Some(p) = &nem.pair {
        let spread = |v: &[Duration]| {
            let mut t = v.to_vec();
            t.sort_unstable();
            let ms = |d: Option<&Duration>| d.map_or(0, |d| d.as_millis());
            format!(
                "min {} ms, median {} ms, max {} ms",
                ms(t.first()),
                ms(t.get(t.len() / 2)),
                ms(t.last())
            )
        };
        println!(
            "takeovers: {} (the owner's end to the standby serving: {}); nodes killed while taking over: {}, after which one of the two started again served {} times ({})",
            p.takeovers.len(),
            spread(&p.takeovers),
            p.takeover_kills,
            p.comebacks.len(),
            spread(&p.comebacks)
        );
    }
    if args.damage {
        let per_kind: Vec<String> = nem
            .damage_kinds
            .iter()
            .map(|k| {
                let (a, r, st) = nem.damage_outcomes.get(k).copied().unwrap_or_default();
                format!("{k} {a} ({r} refused, {st} started)")
            })
            .collect();
        let (a, r, st) = nem
            .damage_outcomes
            .values()
            .fold((0, 0, 0), |x, o| (x.0 + o.0, x.1 + o.1, x.2 + o.2));
        println!(
            "damage applied: {a}; start refused naming the damaged file: {r}; started (nothing acknowledged may be missing): {st}; by kind: {}",
            per_kind.join(", ")
        );
        if !nem.damage_unrefused.is_empty() {
            println!(
                "damage the start rule must refuse, started anyway: {} ({})",
                nem.damage_unrefused.len(),
                nem.damage_unrefused
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
    }
    if nem.power {
        println!(
            "power cuts (directory rebuilt from the durable mirror): {}{}",
            nem.restores,
            if args.shim_mode == "torn" {
                format!(", {} unsynced pages let through", nem.torn_pages)
            } else {
                String::new()
            }
        );
    }
    let calls: Vec<String> = nem
        .calls
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(c, n)| format!("{c} {n}"))
        .collect();
    println!(
        "file-system calls seen by the library: {}",
        calls.join(", ")
    );
    let counted: Vec<String> = nem
        .counters
        .totals()
        .iter()
        .map(|(name, n)| format!("{name} {n}"))
        .collect();
    println!(
        "server counters, summed over its starts (read every 100 ms, so at least): {}",
        counted.join(", ")
    );
    for (k, v) in &report.info {
        println!("{k}: {v}");
    }
    println!();
    print!("{}", report.table());
    println!(
        "total violations: {} (rows in parentheses are informational)",
        report.violations()
    );
}
