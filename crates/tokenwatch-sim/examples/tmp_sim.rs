use clap::Parser;
#[derive(Parser)]
struct Cli { #[command(flatten)] args: tokenwatch_sim::SimArgs }
#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = tokenwatch_sim::run(cli.args).await { eprintln!("error: {e}"); std::process::exit(1); }
}
