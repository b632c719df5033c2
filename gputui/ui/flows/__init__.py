"""The app by user flow. A flow is one thing a user does in the app, from the key to the last notification
(release a host; start its stopped instance; carry files: sync a job's tree, forward a URL it printed); ``app.py``
is the frame, whose action for such a key is one line into its flow. Flows talk to the core and to the app through
a small public surface: the app's ``config``, ``hosts``, ``stream``, ``session(host)``, ``ledger``,
``release_call``, ``start_call``, ``confirm(...)`` and
Textual's ``notify``, ``push_screen``, ``run_worker``, ``copy_to_clipboard``; never the app's private parts (a
test holds them to it). A flow module loads when its key is first pressed."""

NOTIFY_S = 8.0  # how long a notification stays
NAME_CHARS = 120  # a job's name, a host's or a command in a dialog or notification title
