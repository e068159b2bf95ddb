//! What a session sends while a service throttles it. After a rate
//! limiter's refusal (429), requests of that operation leave one at a
//! time, never before the refusal's retry hint, at a pace learnt TCP's
//! way: one request per wait asked at first, raised by a quarter each
//! second (a quarter of a request per second for each answer served; by
//! one per second while slower than one a second, so that a long
//! suspension is soon over) until a request sent at that pace is refused,
//! then halved by each such refusal and raised by a tenth each second (by
//! one per second at most), until the service takes them freely again. A strict limiter
//! refuses whatever leaves faster than its rate, so that every step past
//! it costs a refusal: the steps are small where a step is a large part
//! of the rate. Every caller of the session shares the pace, so that one
//! refusal is not answered by a burst of retries, and a wave of calls
//! costs the cloud about one call each rather than one per retry (a herd
//! of waiters let go at once would be refused again, round after round).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::service::ServiceType;

/// The slowest pace: one request a minute.
const MIN_RATE: f64 = 1.0 / 60.0;
/// Past this pace, or this long without a refusal, the operation is free
/// again.
const FREE_RATE: f64 = 50.0;
const CALM: Duration = Duration::from_secs(60);

type Key = (ServiceType, &'static str);

/// When a request may leave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Turn {
    Now,
    At(Instant),
}

#[derive(Debug)]
struct Pace {
    /// Requests per second.
    rate: f64,
    /// The earliest the next request may leave.
    next: Instant,
    last_refusal: Instant,
    /// Still finding the service's rate: no request sent at the pace has
    /// been refused yet.
    probing: bool,
}

#[derive(Debug, Default)]
pub(super) struct Pacer {
    paces: Mutex<HashMap<Key, Pace>>,
}

impl Pacer {
    fn paces(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Pace>> {
        self.paces.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a request of `key` may leave now (its turn is then taken:
    /// the next one leaves a pace later), else the earliest it may. A
    /// waiter asks again then, at the pace of that moment (which answers
    /// served meanwhile have raised), and may find another took that turn.
    pub(super) fn turn(&self, key: Key, now: Instant) -> Turn {
        let mut paces = self.paces();
        let Some(p) = paces.get_mut(&key) else {
            return Turn::Now;
        };
        if p.next > now {
            return Turn::At(p.next);
        }
        if now.duration_since(p.last_refusal) >= CALM {
            paces.remove(&key);
            return Turn::Now;
        }
        p.next = now + Duration::from_secs_f64(1.0 / p.rate);
        Turn::Now
    }

    /// The service refused a request of `key`, sent at `sent`, as over its
    /// rate, asking (or, without a hint, being given) `wait` before the
    /// next one. The pace is halved once per refusal of a request sent at
    /// it: those already under way when it was set (a burst sent before
    /// anything was known) say nothing new about it.
    pub(super) fn refused(&self, key: Key, wait: Duration, sent: Instant) {
        let now = Instant::now();
        let mut paces = self.paces();
        let p = paces.entry(key).or_insert_with(|| Pace {
            // the first refusal: one request per wait asked
            rate: (1.0 / wait.as_secs_f64().max(0.05)).clamp(MIN_RATE, FREE_RATE) * 2.0,
            next: now,
            last_refusal: sent,
            probing: true,
        });
        if sent >= p.last_refusal {
            if p.last_refusal != sent {
                // refused at the pace it had set: past the service's rate
                p.probing = false;
            }
            p.rate = (p.rate / 2.0).max(MIN_RATE);
            p.last_refusal = now;
        }
        p.next = p.next.max(now + wait);
    }

    /// The service served a request of `key`: faster (see the module's
    /// comment for how much).
    pub(super) fn served(&self, key: Key) {
        let mut paces = self.paces();
        let Some(p) = paces.get_mut(&key) else {
            return;
        };
        p.rate += match (p.probing, p.rate < 1.0) {
            (true, true) => 1.0,
            // `rate` answers a second: a quarter more each second
            (true, false) => 0.25,
            // a tenth more each second, one per second more at most
            (false, _) => (1.0 / p.rate).min(0.1),
        };
        if p.rate >= FREE_RATE {
            paces.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: Key = (ServiceType::BlockStorage, "volume_get");

    #[test]
    fn slow_paces_are_raised_gently_once_the_rate_is_found_and_fast_after_a_long_suspension() {
        let p = Pacer::default();
        let rate = |p: &Pacer| p.paces().get(&KEY).map(|x| x.rate);
        // a limiter of one a second: one per wait asked, then a quarter
        // of a request per second more per answer while probing
        let burst = Instant::now();
        p.refused(KEY, Duration::from_secs(1), burst);
        assert!((rate(&p).unwrap() - 1.0).abs() < 1e-9);
        p.served(KEY);
        assert!(
            (rate(&p).unwrap() - 1.25).abs() < 1e-9,
            "not twice the rate at once"
        );
        // refused past it: halved, then a tenth per answer (one request a
        // second gains a tenth of a request per second each second)
        p.refused(KEY, Duration::from_millis(200), Instant::now());
        assert!((rate(&p).unwrap() - 0.625).abs() < 1e-9);
        for _ in 0..3 {
            p.served(KEY);
        }
        assert!((rate(&p).unwrap() - 0.925).abs() < 1e-9);
        // a suspension of a minute: one per minute, then soon one a second
        let q = Pacer::default();
        q.refused(KEY, Duration::from_secs(60), Instant::now());
        q.served(KEY);
        let r = rate(&q).unwrap();
        assert!(r > 1.0 && r < 1.1, "{r}");
    }

    #[test]
    fn free_until_refused_then_one_at_a_time_never_before_the_hint() {
        let p = Pacer::default();
        let now = Instant::now();
        assert_eq!(p.turn(KEY, now), Turn::Now, "free");
        p.refused(KEY, Duration::from_secs(2), now);
        let Turn::At(first) = p.turn(KEY, now) else {
            panic!("a turn at once after a refusal");
        };
        assert!(first >= now + Duration::from_secs(2), "not before the hint");
        assert_eq!(p.turn(KEY, first), Turn::Now);
        let Turn::At(second) = p.turn(KEY, first) else {
            panic!("two at once");
        };
        assert!(second > first, "one at a time");
        // another operation is not paced
        let other = (ServiceType::BlockStorage, "volume_create");
        assert_eq!(p.turn(other, now), Turn::Now);
        // free again once calm
        let calm = now + CALM + Duration::from_secs(3);
        assert_eq!(p.turn(KEY, calm), Turn::Now);
        assert_eq!(p.turn(KEY, calm), Turn::Now);
    }

    #[test]
    fn refusals_halve_the_pace_and_answers_raise_it_until_free() {
        let p = Pacer::default();
        let burst = Instant::now();
        p.refused(KEY, Duration::from_millis(100), burst);
        let rate = |p: &Pacer| p.paces().get(&KEY).map(|x| x.rate);
        let r0 = rate(&p).unwrap();
        assert!((r0 - 10.0).abs() < 1e-9, "one per wait asked: {r0}");
        // the rest of a burst sent before the first refusal: no news
        for _ in 0..50 {
            p.refused(KEY, Duration::from_millis(100), burst);
        }
        assert!((rate(&p).unwrap() - 10.0).abs() < 1e-9);
        // probing: a quarter of a request per second more for each answer
        for _ in 0..2 {
            p.served(KEY);
        }
        assert!((rate(&p).unwrap() - 10.5).abs() < 1e-9);
        // one sent at the pace and refused: halved, and raised slowly
        // from then on: about one per second more each second
        p.refused(KEY, Duration::from_millis(100), Instant::now());
        assert!((rate(&p).unwrap() - 5.25).abs() < 1e-9);
        for _ in 0..8 {
            p.served(KEY);
        }
        let r = rate(&p).unwrap();
        assert!(r > 6.04 && r < 6.06, "a tenth more for each answer: {r}");
        for _ in 0..5000 {
            p.served(KEY);
        }
        assert_eq!(rate(&p), None, "free again");
    }
}
