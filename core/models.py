# core has no models of its own; this module makes Django send it post_migrate (roles sync).
