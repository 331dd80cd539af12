from steps.validate_data.step import main

raise SystemExit(main())
