"""Results JSON to leaderboards (Markdown, HTML, CSV) and plots."""
