// A parse-only stand-in for nlohmann/json.hpp, which torch's wheel does not ship.
//
// backend/flight_record.cpp includes torch's FlightRecorderDetail.hpp for the definitions
// of FlightRecorder<c10::Event>::recordWithResetEnabled, record_pg_ranks and
// retire_completed: they are templates that libtorch does not export, so ringpg
// instantiates them itself, acting on the one recorder instance torch keeps for it
// (c10d::getFlightRecorder, which is exported).  That header also defines
// FlightRecorder::dump_json, which names nlohmann::json; ringpg never instantiates it
// (torch's own dump functions do the dumping), so the type only has to be declared
// well enough for the template's definition to parse.  Nothing here is defined: were
// anything to use it, the extension would fail to link, never misbehave.
#pragma once

#include <string>

namespace nlohmann {

struct json {
  template <typename Key>
  json& operator[](const Key& key);
  template <typename Value>
  json& operator=(const Value& value);
  std::string dump() const;
};

} // namespace nlohmann
