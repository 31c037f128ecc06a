// The alert engine's kept state on /metrics through the binary: with a small
// `alerting.max_records_per_model`, records beyond it are thinned or evicted and counted, and the bytes kept stay bounded.

use crate::alerting_support;
use crate::common;

use alerting_support::{FAST, Stack, Traffic};
use common::{get, metric_value};
use std::time::{Duration, Instant};

const CAP: f64 = 40.0;

const CONFIG: &str = "alerting:\n  max_records_per_model: 40\n";

/// (requests proxied, records evicted, records thinned, bytes kept) from one scrape.
async fn figures(s: &Stack) -> (Option<f64>, Option<f64>, Option<f64>, Option<f64>) {
    let r = get(&format!("http://{}/metrics", s.api)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let requests: Option<f64> = r
        .body
        .lines()
        .filter(|l| l.starts_with("tokenwatch_requests_total{"))
        .map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum();
    (
        requests,
        metric_value(&r.body, "tokenwatch_alerting_evicted_records_total"),
        metric_value(&r.body, "tokenwatch_alerting_thinned_records_total"),
        metric_value(&r.body, "tokenwatch_alerting_kept_bytes"),
    )
}

#[tokio::test]
async fn records_over_the_per_model_cap_are_thinned_or_evicted_and_counted() {
    let s = Stack::with_sim(FAST, CONFIG).await;

    // Before any request: the figures are exposed, at zero.
    let (_, evicted, thinned, kept) = figures(&s).await;
    assert_eq!(evicted, Some(0.0), "{}", s.log_tail());
    assert_eq!(thinned, Some(0.0), "{}", s.log_tail());
    assert_eq!(kept, Some(0.0), "{}", s.log_tail());

    let traffic = Traffic::plain(s.proxy, 4);
    traffic
        .wait_requests(3 * CAP as u64, Duration::from_secs(60))
        .await;
    traffic.stop().await;

    // Once the engine has taken every record the proxy counted, all but at most the cap (and
    // a quarter, between two evaluations) went: the older ones thinned (a uniform sample stays)
    // or, beyond what thinning keeps up with, evicted (one model; the default rules keep
    // records far longer than this test). Thinning goes on as the kept records age.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (requests, evicted, thinned, kept) = loop {
        let (requests, evicted, thinned, kept) = figures(&s).await;
        if let (Some(n), Some(e), Some(t)) = (requests, evicted, thinned)
            && n >= 3.0 * CAP
            && e + t >= n - 1.25 * CAP
            && t > 0.0
        {
            break (n, e, t, kept);
        }
        assert!(
            Instant::now() < deadline,
            "thinned + evicted never reached requests − cap: requests {requests:?}, \
             evicted {evicted:?}, thinned {thinned:?}\n{}",
            s.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        evicted + thinned <= requests,
        "requests {requests}, evicted {evicted}, thinned {thinned}"
    );

    // The records kept (at most 50 of one model) take one chunk of room, plus the early
    // first-token copies: more than nothing, far below a megabyte.
    let kept = kept.expect("tokenwatch_alerting_kept_bytes missing");
    assert!(kept > 0.0 && kept < 1024.0 * 1024.0, "kept bytes {kept}");
}
