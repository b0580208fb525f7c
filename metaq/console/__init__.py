"""The web console (``metaq console``): the cluster, lag and failovers at a glance, drills with a
live timeline, and the CLI's operations behind the same checks. See docs/console.md."""
