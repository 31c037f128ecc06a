// The source registry: the sources the configuration asks for, one line each, every source
// handed only its own section (the proxy is wired separately, in `app.rs`).

use super::{Source, gpu, otlp, posted, scrape};
use crate::config::Config;

/// The sources the configuration asks for (the proxy is wired separately, in `app.rs`).
pub fn from_config(cfg: &Config) -> anyhow::Result<Vec<Box<dyn Source>>> {
    let mut sources: Vec<Box<dyn Source>> = Vec::new();
    sources.extend(scrape::from_config(&cfg.scrape)?);
    sources.extend(otlp::from_config(&cfg.otlp, &cfg.limits)?);
    sources.extend(gpu::from_config(&cfg.gpu)?);
    sources.push(Box::new(posted::Posted));
    Ok(sources)
}
