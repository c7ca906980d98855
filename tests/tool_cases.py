"""Tools and schemas of many shapes (nested objects, enums, arrays, bounds, required fields), each
with two prompts: what the tool and structured-output tests send."""

from __future__ import annotations

from typing import Any

TOOLS: list[dict[str, Any]] = [
    {"name": "get_weather", "description": "Get the current weather in a city",
     "schema": {"type": "object", "properties": {
         "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]},
     "prompts": ["What's the weather in Paris?", "Is it cold in Oslo right now, in fahrenheit?"]},
    {"name": "search_flights", "description": "Search flights between two airports",
     "schema": {"type": "object", "properties": {
         "route": {"type": "object", "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
                   "required": ["from", "to"]},
         "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
         "cabin": {"enum": ["economy", "business", "first"]}}, "required": ["route", "passengers"]},
     "prompts": ["Find me a flight from London to New York for two people.", "Business class from Tokyo to Seoul."]},
    {"name": "create_event", "description": "Create a calendar event",
     "schema": {"type": "object", "properties": {
         "title": {"type": "string"}, "attendees": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
         "time": {"type": "object", "properties": {"start": {"type": "string"}, "minutes": {"type": "integer"}},
                  "required": ["start"]}}, "required": ["title", "time"]},
     "prompts": ["Schedule a meeting with Ana and Bo tomorrow at 10.", "Put lunch with Sam on my calendar at noon."]},
    {"name": "set_thermostat", "description": "Set the thermostat",
     "schema": {"type": "object", "properties": {
         "temperature": {"type": "number", "minimum": 5, "maximum": 30},
         "mode": {"enum": ["heat", "cool", "auto"]}}, "required": ["temperature", "mode"]},
     "prompts": ["Make it 21 degrees in here.", "Cool the house down to 18."]},
    {"name": "send_email", "description": "Send an email",
     "schema": {"type": "object", "properties": {
         "to": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
         "subject": {"type": "string"}, "urgent": {"type": "boolean"}}, "required": ["to", "subject", "urgent"]},
     "prompts": ["Email bob@example.com that the report is late.", "Tell the team the server is down, urgently."]},
    {"name": "add_todos", "description": "Add items to the to-do list",
     "schema": {"type": "object", "properties": {
         "items": {"type": "array", "minItems": 1, "maxItems": 4, "items": {"type": "object", "properties": {
             "text": {"type": "string"}, "priority": {"enum": ["low", "high"]}}, "required": ["text", "priority"]}}},
         "required": ["items"]},
     "prompts": ["Remind me to buy milk and call mom.", "Add 'fix the bike' as a high priority task."]},
    {"name": "convert_currency", "description": "Convert an amount between currencies",
     "schema": {"type": "object", "properties": {
         "amount": {"type": "number"}, "from": {"enum": ["USD", "EUR", "GBP", "JPY"]},
         "to": {"enum": ["USD", "EUR", "GBP", "JPY"]}}, "required": ["amount", "from", "to"]},
     "prompts": ["How much is 100 dollars in euros?", "Convert 5000 yen to pounds."]},
    {"name": "book_table", "description": "Book a restaurant table",
     "schema": {"type": "object", "properties": {
         "restaurant": {"type": "string"}, "party_size": {"type": "integer", "minimum": 1, "maximum": 20},
         "outdoor": {"type": "boolean"}}, "required": ["restaurant", "party_size"]},
     "prompts": ["Book a table for four at Luigi's.", "Reserve an outdoor table for two at The Oak."]},
    {"name": "lookup_stock", "description": "Look up a stock price",
     "schema": {"type": "object", "properties": {
         "symbol": {"type": "string", "maxLength": 6}, "exchange": {"enum": ["NYSE", "NASDAQ", "LSE"]}},
         "required": ["symbol", "exchange"]},
     "prompts": ["What is Apple trading at?", "Price of VOD on the London exchange?"]},
    {"name": "translate", "description": "Translate text",
     "schema": {"type": "object", "properties": {
         "text": {"type": "string"}, "target": {"enum": ["fr", "de", "es", "it"]},
         "formal": {"type": "boolean"}}, "required": ["text", "target", "formal"], "additionalProperties": False},
     "prompts": ["Translate 'good morning' to French.", "How do you say 'thank you' in German, politely?"]},
]  # fmt: skip

CASES = [(tool, prompt) for tool in TOOLS for prompt in tool["prompts"]]  # 20 prompts, 10 schemas
