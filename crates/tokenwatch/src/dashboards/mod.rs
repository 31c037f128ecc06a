// Dashboards for other systems (`tokenwatch dashboards export`): definitions over tokenwatch's
// `/metrics` and the runtimes' own metrics, rendered for a dashboarding tool (Grafana).

pub mod grafana;
