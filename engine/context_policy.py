"""The context policies by name: what a chat does once it outgrows its model's context.

A conversation's setting names one. The history store checks a stored or imported setting against these
names (engine.history.validate) and the chat window carries each policy out (engine.chat.window); the names
live apart from both packages so that neither imports the other for them.
"""

POLICIES = ("drop_oldest", "stop")
