// Routing of proxied requests to upstreams by model: the upstreams listing the model, else the
// catch-all upstreams, each set a pool balanced by in-flight requests (lock-free atomics).

use crate::kernel::tls::UpstreamTls;
use crate::sources::proxy::config::{UpstreamConfig, parse_upstream_url};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug)]
pub struct Route {
    /// Position in the configuration (`proxy.upstreams[index]`).
    index: usize,
    /// `http` or `https`.
    scheme: &'static str,
    authority: http::uri::Authority,
    base_path: String,
    /// TLS settings of an https upstream (its CA file read at start).
    tls: Option<UpstreamTls>,
    pub runtime: String,
    pub instance: String,
    /// Requests routed here whose response has not ended yet (shared with their `Slot`s).
    in_flight: Arc<AtomicUsize>,
}

impl Route {
    fn new(index: usize, u: &UpstreamConfig) -> Result<Route, String> {
        let key = format!("proxy.upstreams[{index}]");
        let url = parse_upstream_url(&u.url).map_err(|e| format!("{key}.url: {e}"))?;
        let tls = match (url.https, &u.tls) {
            (true, tls) => Some(
                UpstreamTls::new(tls.as_ref())
                    .map_err(|e| format!("{key}.tls.{}: {e}", e.key()))?,
            ),
            (false, Some(_)) => {
                return Err(format!("{key}.tls: tls applies to https:// upstreams only"));
            }
            (false, None) => None,
        };
        Ok(Route {
            index,
            scheme: if url.https { "https" } else { "http" },
            instance: u
                .instance
                .clone()
                .unwrap_or_else(|| url.authority.to_string()),
            authority: url.authority,
            base_path: url.base_path,
            tls,
            runtime: u.runtime.clone(),
            in_flight: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The upstream URI for a client request URI (path and query kept).
    pub fn uri_for(&self, client: &http::Uri) -> Result<http::Uri, String> {
        let pq = client.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        format!(
            "{}://{}{}{}",
            self.scheme, self.authority, self.base_path, pq
        )
        .parse()
        .map_err(|e| format!("cannot build the upstream URL for {pq:?}: {e}"))
    }

    /// Position in the configuration: indexes per-upstream state kept beside the router.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The TLS settings of an https upstream; `None` for plain http.
    pub fn tls(&self) -> Option<&UpstreamTls> {
        self.tls.as_ref()
    }

    /// Requests routed here and not finished yet (pooled routes only; 0 for a lone upstream).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// A request's claim on a pooled upstream: counted in flight until dropped (when the response
/// body ends, fails or is abandoned).
#[derive(Debug)]
pub struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// One more in `counter`, until the slot is dropped.
    pub fn enter(counter: &Arc<AtomicUsize>) -> Slot {
        counter.fetch_add(1, Ordering::Relaxed);
        Slot(counter.clone())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Upstreams serving the same models, in configuration order.
#[derive(Debug)]
struct Pool {
    members: Box<[usize]>,
    /// Where the next tie-break scan starts (round-robin among equally loaded members).
    next: AtomicUsize,
}

impl Pool {
    fn new(members: Vec<usize>) -> Pool {
        Pool {
            members: members.into_boxed_slice(),
            next: AtomicUsize::new(0),
        }
    }
}

#[derive(Debug, Default)]
pub struct Router {
    routes: Vec<Route>,
    /// One pool per model name listed by any upstream, in order of first mention.
    by_model: Vec<(String, Pool)>,
    /// The upstreams with `models: ['*']` (or none listed); empty when there are none.
    any_model: Option<Pool>,
    /// Weighted splits between model versions (`proxy.routes`), taking their models first.
    splits: Vec<Arc<super::split::SplitTable>>,
}

impl Router {
    pub fn new(upstreams: &[UpstreamConfig]) -> Result<Router, String> {
        let routes = upstreams
            .iter()
            .enumerate()
            .map(|(i, u)| Route::new(i, u))
            .collect::<Result<Vec<_>, _>>()?;
        let mut by_model: Vec<(String, Vec<usize>)> = Vec::new();
        let mut any = Vec::new();
        for (i, u) in upstreams.iter().enumerate() {
            if u.serves_any_model() {
                any.push(i);
            }
            for m in u.models.iter().filter(|m| *m != "*") {
                match by_model.iter_mut().find(|(name, _)| name == m) {
                    Some((_, members)) if !members.contains(&i) => members.push(i),
                    Some(_) => {}
                    None => by_model.push((m.clone(), vec![i])),
                }
            }
        }
        Ok(Router {
            routes,
            by_model: by_model
                .into_iter()
                .map(|(m, members)| (m, Pool::new(members)))
                .collect(),
            any_model: (!any.is_empty()).then(|| Pool::new(any)),
            splits: Vec::new(),
        })
    }

    /// Add the weighted splits of `proxy.routes` (errors name the key path).
    pub fn with_splits(mut self, routes: &[super::split::RouteConfig]) -> Result<Router, String> {
        super::split::validate(routes).map_err(|(path, msg)| format!("{path}: {msg}"))?;
        for (i, cfg) in routes.iter().enumerate() {
            let key = format!("proxy.routes[{i}]");
            let upstreams: Vec<(&str, usize)> = self
                .routes
                .iter()
                .map(|r| (r.instance.as_str(), r.index()))
                .collect();
            self.splits.push(Arc::new(super::split::SplitTable::new(
                &key, cfg, &upstreams,
            )?));
        }
        Ok(self)
    }

    /// The weighted splits, in configuration order.
    pub fn splits(&self) -> &[Arc<super::split::SplitTable>] {
        &self.splits
    }

    /// The upstream for a request naming `model` from `tenant`: a split's arm when a route of
    /// `proxy.routes` covers the model (with the arm's version), else `route`'s choice.
    pub fn route_for(
        &self,
        model: Option<&str>,
        tenant: &str,
    ) -> Option<(&Route, Option<Slot>, Option<&str>)> {
        if let Some(t) = model.and_then(|m| self.splits.iter().find(|t| t.model == m)) {
            let (index, version) = t.pick(tenant);
            let route = self.routes.get(index)?;
            route.in_flight.fetch_add(1, Ordering::Relaxed);
            return Some((route, Some(Slot(route.in_flight.clone())), Some(version)));
        }
        self.route(model).map(|(r, s)| (r, s, None))
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Share the in-flight counts of `old`'s routes to the same upstream (URL and instance), so
    /// requests still running on the old routes count in the new pools (configuration reload).
    pub fn keep_counts_from(&mut self, old: &Router) {
        for r in &mut self.routes {
            let same = old.routes.iter().find(|o| {
                o.scheme == r.scheme
                    && o.authority == r.authority
                    && o.base_path == r.base_path
                    && o.instance == r.instance
            });
            if let Some(o) = same {
                r.in_flight = o.in_flight.clone();
            }
        }
    }

    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The model names requests are routed by, each with the runtime of the upstream serving
    /// it (a split's stable arm, else the first upstream listing it): splits first, then the
    /// models the upstreams list, in configuration order, each once.
    pub fn named_models(&self) -> Vec<(&str, &str)> {
        let mut named: Vec<(&str, &str)> = Vec::new();
        let splits = self
            .splits
            .iter()
            .map(|t| (t.model.as_str(), t.stable_route()));
        let listed = self
            .by_model
            .iter()
            .map(|(m, pool)| (m.as_str(), pool.members[0]));
        for (model, route) in splits.chain(listed) {
            if !named.iter().any(|(m, _)| *m == model) {
                named.push((model, self.routes[route].runtime.as_str()));
            }
        }
        named
    }

    /// The upstream for a request naming `model`: the pool of upstreams listing the model, else
    /// the pool of catch-all upstreams. A pool of one is that upstream (no counting); in a larger
    /// pool the member with the fewest requests in flight wins, ties going round-robin, and the
    /// returned `Slot` keeps the request counted until it is dropped.
    pub fn route(&self, model: Option<&str>) -> Option<(&Route, Option<Slot>)> {
        let pool = model
            .and_then(|m| {
                self.by_model
                    .iter()
                    .find(|(name, _)| name == m)
                    .map(|(_, p)| p)
            })
            .or(self.any_model.as_ref())?;
        if let [only] = *pool.members {
            return Some((&self.routes[only], None));
        }
        let n = pool.members.len();
        let start = pool.next.fetch_add(1, Ordering::Relaxed) % n;
        let mut best = pool.members[start];
        let mut best_load = self.routes[best].in_flight();
        for k in 1..n {
            if best_load == 0 {
                break;
            }
            let i = pool.members[(start + k) % n];
            let load = self.routes[i].in_flight();
            if load < best_load {
                (best, best_load) = (i, load);
            }
        }
        let route = &self.routes[best];
        route.in_flight.fetch_add(1, Ordering::Relaxed);
        Some((route, Some(Slot(route.in_flight.clone()))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(url: &str, models: &[&str]) -> UpstreamConfig {
        UpstreamConfig {
            url: url.into(),
            models: models.iter().map(|s| s.to_string()).collect(),
            runtime: "vllm".into(),
            instance: None,
            tls: None,
        }
    }

    fn pick(r: &Router, model: Option<&str>) -> (String, Option<Slot>) {
        let (route, slot) = r.route(model).expect("a route");
        (route.instance.clone(), slot)
    }

    #[test]
    fn routes_by_model_then_default() {
        let r = Router::new(&[
            up("http://127.0.0.1:1", &["a"]),
            up("http://127.0.0.1:2/base/", &["*"]),
        ])
        .unwrap();
        assert_eq!(pick(&r, Some("a")).0, "127.0.0.1:1");
        assert_eq!(pick(&r, Some("b")).0, "127.0.0.1:2");
        assert_eq!(pick(&r, None).0, "127.0.0.1:2");
        let uri = r
            .route(None)
            .unwrap()
            .0
            .uri_for(&"/v1/models?x=1".parse().unwrap())
            .unwrap();
        assert_eq!(uri.to_string(), "http://127.0.0.1:2/base/v1/models?x=1");
        let only = Router::new(&[up("http://127.0.0.1:1", &["a"])]).unwrap();
        assert!(only.route(Some("z")).is_none());
    }

    #[test]
    fn https_upstreams_keep_their_scheme_and_tls() {
        let r = Router::new(&[
            up("http://127.0.0.1:1", &["a"]),
            up("https://api.example.com/openai/", &["*"]),
        ])
        .unwrap();
        let (plain, _) = r.route(Some("a")).unwrap();
        assert!(plain.tls().is_none());
        assert_eq!(plain.index(), 0);
        let (tls, _) = r.route(Some("b")).unwrap();
        assert!(tls.tls().is_some());
        assert_eq!((tls.index(), tls.instance.as_str()), (1, "api.example.com"));
        let uri = tls
            .uri_for(&"/v1/chat/completions".parse().unwrap())
            .unwrap();
        assert_eq!(
            uri.to_string(),
            "https://api.example.com/openai/v1/chat/completions"
        );

        let mut bad = up("http://127.0.0.1:1", &["a"]);
        bad.tls = Some(Default::default());
        let e = Router::new(&[bad]).unwrap_err();
        assert!(e.contains("proxy.upstreams[0].tls"), "{e}");
        let mut missing = up("https://h:1", &["a"]);
        missing.tls = Some(crate::kernel::tls::UpstreamTlsConfig {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..Default::default()
        });
        let e = Router::new(&[up("http://127.0.0.1:1", &[]), missing]).unwrap_err();
        assert!(
            e.contains("proxy.upstreams[1].tls.ca_file") && e.contains("/nonexistent/ca.pem"),
            "{e}"
        );
        let e = Router::new(&[up("ftp://h", &[])]).unwrap_err();
        assert!(e.contains("proxy.upstreams[0].url"), "{e}");
    }

    #[test]
    fn a_lone_upstream_is_not_counted() {
        let r = Router::new(&[
            up("http://127.0.0.1:1", &["a"]),
            up("http://127.0.0.1:2", &["b", "*"]),
        ])
        .unwrap();
        for _ in 0..3 {
            let (inst, slot) = pick(&r, Some("a"));
            assert_eq!(inst, "127.0.0.1:1");
            assert!(slot.is_none());
        }
        assert!(r.routes().iter().all(|x| x.in_flight() == 0));
    }

    #[test]
    fn ties_go_round_robin_and_keep_their_instance_label() {
        let mut ups = vec![
            up("http://127.0.0.1:1", &["m"]),
            up("http://127.0.0.1:2", &["m"]),
            up("http://127.0.0.1:3", &["m"]),
        ];
        ups[1].instance = Some("gpu-b".into());
        let r = Router::new(&ups).unwrap();
        // Each request ends before the next: every pick is a tie, so they rotate.
        let seq: Vec<String> = (0..6).map(|_| pick(&r, Some("m")).0).collect();
        assert_eq!(
            seq,
            [
                "127.0.0.1:1",
                "gpu-b",
                "127.0.0.1:3",
                "127.0.0.1:1",
                "gpu-b",
                "127.0.0.1:3"
            ]
        );
        assert!(r.routes().iter().all(|x| x.in_flight() == 0));
    }

    #[test]
    fn fewest_in_flight_wins() {
        let r = Router::new(&[
            up("http://127.0.0.1:1", &["m"]),
            up("http://127.0.0.1:2", &["m", "x"]),
        ])
        .unwrap();
        let loads = || r.routes().iter().map(Route::in_flight).collect::<Vec<_>>();
        // Three long requests: one on each member, the third on a tie.
        let (a, sa) = pick(&r, Some("m"));
        let (b, sb) = pick(&r, Some("m"));
        let (c, sc) = pick(&r, Some("m"));
        assert_eq!(
            (a.as_str(), b.as_str(), c.as_str()),
            ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1")
        );
        assert_eq!(loads(), [2, 1]);
        // Short requests all go to the less loaded member, whatever the rotation says.
        for _ in 0..4 {
            assert_eq!(pick(&r, Some("m")).0, "127.0.0.1:2");
        }
        drop(sa);
        drop(sc);
        assert_eq!(loads(), [0, 1]);
        for _ in 0..3 {
            assert_eq!(pick(&r, Some("m")).0, "127.0.0.1:1");
        }
        drop(sb);
        assert_eq!(loads(), [0, 0]);
        // `x` is listed by member 2 alone: a pool of one, uncounted.
        assert!(pick(&r, Some("x")).1.is_none());
    }

    #[test]
    fn a_new_router_keeps_the_counts_of_the_same_upstreams() {
        let old = Router::new(&[
            up("http://127.0.0.1:1", &["m"]),
            up("http://127.0.0.1:2", &["m"]),
        ])
        .unwrap();
        let (_, held) = pick(&old, Some("m"));
        assert_eq!(old.routes()[0].in_flight(), 1);
        let mut new = Router::new(&[
            up("http://127.0.0.1:3", &["m"]),
            up("http://127.0.0.1:1", &["m"]),
        ])
        .unwrap();
        new.keep_counts_from(&old);
        assert_eq!(
            new.routes()
                .iter()
                .map(Route::in_flight)
                .collect::<Vec<_>>(),
            [0, 1]
        );
        // The held request is on :1, so the next one goes to the idle :3.
        assert_eq!(pick(&new, Some("m")).0, "127.0.0.1:3");
        drop(held);
        assert!(new.routes().iter().all(|x| x.in_flight() == 0));
    }

    #[test]
    fn catch_all_upstreams_form_a_pool() {
        let r = Router::new(&[
            up("http://127.0.0.1:1", &["a"]),
            up("http://127.0.0.1:2", &[]),
            up("http://127.0.0.1:3", &["*"]),
        ])
        .unwrap();
        let (x, _sx) = pick(&r, Some("other"));
        let (y, _sy) = pick(&r, None);
        let mut both = [x, y];
        both.sort();
        assert_eq!(both, ["127.0.0.1:2", "127.0.0.1:3"]);
        assert_eq!(pick(&r, Some("a")).0, "127.0.0.1:1");
    }
}
