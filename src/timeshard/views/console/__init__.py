"""The operator console of a node (issue 37): find, understand and act on jobs in a browser.

``app.build(node, settings)`` gives the routes that ``timeshard.views.http`` mounts at
``/console``; see docs/console.md for what each page does and who may use it."""
