"""Telling people: the alert outbox (:mod:`.alerts`), delivered with retries after the
transaction that recorded the event.
"""
