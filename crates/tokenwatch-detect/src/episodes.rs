// Anomaly episodes of one series: when its condition held, so that its baseline leaves those
// periods out and stays frozen while the condition lasts (spec 4: baselines exclude the window
// under test and must not absorb an ongoing anomaly).

/// The ongoing and recent anomaly episodes of one series. Times are unix ms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Episodes {
    open: Option<Open>,
    /// Closed episodes as (from, to]: padded start to the last time the condition held.
    closed: Vec<(i64, i64)>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Open {
    from: i64,
    onset: i64,
    last: i64,
}

/// What one observation did to the episodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpisodeStep {
    /// The condition started to hold: an episode opened.
    Opened,
    /// The episode goes on (condition holding, or absent for less than the release time).
    Ongoing,
    /// The condition has been absent for the release time: the episode closed.
    Closed,
    /// No episode, none opened.
    Quiet,
}

impl Episodes {
    /// Record the condition at `now`. An opening episode covers `pad_ms` before `now` (the
    /// window that showed it); an open one closes once the condition has been absent for
    /// `release_ms`.
    pub fn observe(&mut self, holds: bool, now: i64, pad_ms: i64, release_ms: i64) -> EpisodeStep {
        match (&mut self.open, holds) {
            (None, true) => {
                self.open = Some(Open {
                    from: now - pad_ms.max(0),
                    onset: now,
                    last: now,
                });
                EpisodeStep::Opened
            }
            (None, false) => EpisodeStep::Quiet,
            (Some(o), true) => {
                o.last = now;
                EpisodeStep::Ongoing
            }
            (Some(o), false) if now - o.last >= release_ms => {
                self.closed.push((o.from, o.last));
                self.open = None;
                EpisodeStep::Closed
            }
            (Some(_), false) => EpisodeStep::Ongoing,
        }
    }

    /// Forget an episode open longer than `max_ms` (a lasting change is the new normal: the
    /// baseline learns it). True when one was forgotten.
    pub fn expire(&mut self, now: i64, max_ms: i64) -> bool {
        if self.open.is_some_and(|o| now - o.onset > max_ms) {
            self.open = None;
            return true;
        }
        false
    }

    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// When the ongoing episode started.
    pub fn onset(&self) -> Option<i64> {
        self.open.map(|o| o.onset)
    }

    /// Whether a sample known at `t` lies in an episode (open episodes reach into the future).
    pub fn covers(&self, t: i64) -> bool {
        self.open.is_some_and(|o| t > o.from) || self.closed.iter().any(|&(a, b)| t > a && t <= b)
    }

    /// Drop closed episodes that ended before `before`; true when nothing is left to remember.
    pub fn prune(&mut self, before: i64) -> bool {
        self.closed.retain(|&(_, b)| b >= before);
        self.open.is_none() && self.closed.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_episode_opens_holds_through_short_gaps_and_closes_after_the_release_time() {
        let mut e = Episodes::default();
        assert_eq!(e.observe(false, 0, 60, 100), EpisodeStep::Quiet);
        assert_eq!(e.observe(true, 1000, 60, 100), EpisodeStep::Opened);
        assert_eq!(e.onset(), Some(1000));
        assert!(e.covers(941) && e.covers(5000) && !e.covers(940));
        assert_eq!(e.observe(false, 1050, 60, 100), EpisodeStep::Ongoing);
        assert_eq!(e.observe(true, 1080, 60, 100), EpisodeStep::Ongoing);
        assert_eq!(e.observe(false, 1150, 60, 100), EpisodeStep::Ongoing);
        assert_eq!(e.observe(false, 1180, 60, 100), EpisodeStep::Closed);
        assert!(!e.is_open());
        assert!(e.covers(1000) && e.covers(1080) && !e.covers(1081));
        assert!(!e.prune(1000));
        assert!(e.prune(1081), "the closed episode ended at 1080");
        assert!(!e.covers(1000));
    }

    #[test]
    fn a_lasting_episode_expires_without_being_remembered() {
        let mut e = Episodes::default();
        e.observe(true, 0, 10, 100);
        assert!(!e.expire(500, 1000));
        assert!(e.expire(1001, 1000));
        assert!(!e.is_open() && !e.covers(500));
        assert_eq!(e.observe(true, 1002, 10, 100), EpisodeStep::Opened);
    }
}
