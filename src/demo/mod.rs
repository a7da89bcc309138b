//! The seed article's story, runnable: a demo payment provider and a script that plays
//! the article's scenarios through a real idemproxy process against it.

pub mod provider;
pub mod script;
